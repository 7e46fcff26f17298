/**
 * One watched resource through @kubernetes/client-node's ListWatch informer,
 * as a supervisor {@link Member}: the library lists, watches and re-lists on
 * 410 Gone; this module adds what it lacks (bookmarks and a server-side
 * timeout asked for, the idle watchdog, telling failures apart from lists and
 * watches) and turns each outcome into words for the supervisor. The
 * informer stops on any failure (the library does not retry): the
 * supervisor restarts it, and it resumes from its last resourceVersion.
 *
 * The only module that knows the informer; the objects it hands over go to
 * `onObject` as they are.
 */
import { ListWatch, Watch, type KubeConfig, type KubernetesListObject, type KubernetesObject } from '@kubernetes/client-node';
import type { Logger } from '../../log.js';
import { describeKubeError, qualified, stalledWatch, type ResourceName } from './failures.js';
import { IdleWatchdog, idleLimitMs, type ListWatchSupervisor, type Member } from './supervisor.js';

/** What is watched, and where. */
export interface InformerOptions<T extends KubernetesObject> extends ResourceName {
  kubeConfig: KubeConfig;
  /** Collection path of the list and the watch, e.g. `/api/v1/services`. */
  path: string;
  /** The list call (with the same selectors as the watch). */
  list: () => Promise<KubernetesListObject<T>>;
  labelSelector?: string | undefined;
  fieldSelector?: string | undefined;
  /** Server-side watch timeout to ask for, per watch request (s). */
  timeoutSeconds: () => number;
  supervisor: ListWatchSupervisor;
  /** The API server's URL, for messages. */
  server: string;
  logger: Logger;
  /** An object added or updated (`deleted` false), or deleted. */
  onObject: (obj: T, deleted: boolean) => void;
}

/** Marks errors of the list call, to name the verb in messages. */
class ListError extends Error {
  constructor(readonly inner: unknown) {
    super('list failed', { cause: inner });
  }
}

/** What {@link SourceWatch} tells its informer's member. */
interface WatchHooks {
  /** The source stopped: start no watch, end one that was being opened. */
  stopped: () => boolean;
  timeoutSeconds: () => number;
  opened: (controller: AbortController, timeoutSeconds: number) => void;
  event: (type: string, obj: unknown) => void;
  ended: (err: unknown) => void;
}

/**
 * The library's Watch, plus: bookmarks and a server-side timeout asked for,
 * and hooks when a watch request is established, delivers and ends.
 */
class SourceWatch extends Watch {
  constructor(
    kc: KubeConfig,
    private readonly hooks: WatchHooks,
  ) {
    super(kc);
  }

  override async watch(
    path: string,
    queryParams: Record<string, string | number | boolean | undefined>,
    callback: (phase: string, apiObj: any, watchObj?: any) => void,
    done: (err: any) => void,
  ): Promise<AbortController> {
    // The informer goes on to watch after a list even when stopped meanwhile.
    if (this.hooks.stopped()) return new AbortController();
    let finished = false;
    const end = (err: unknown): void => {
      if (finished) return;
      finished = true;
      this.hooks.ended(err);
      done(err);
    };
    const timeoutSeconds = this.hooks.timeoutSeconds();
    const params = { ...queryParams, allowWatchBookmarks: true, timeoutSeconds };
    let controller: AbortController;
    try {
      controller = await super.watch(
        path,
        params,
        (phase, obj, raw) => {
          this.hooks.event(phase, obj);
          callback(phase, obj, raw);
        },
        end,
      );
    } catch (err) {
      // e.g. an unreadable token file: report it as a failed watch, never as
      // an unhandled rejection (the informer calls us from a callback).
      end(err);
      return new AbortController();
    }
    if (this.hooks.stopped()) controller.abort();
    else if (!finished) this.hooks.opened(controller, timeoutSeconds);
    return controller;
  }
}

/** An informer for one resource, added to `o.supervisor` (which starts it). */
export function addInformer<T extends KubernetesObject>(o: InformerOptions<T>): void {
  const { supervisor, logger: log } = o;
  const name = { resource: o.resource, group: o.group };
  const watchdog = new IdleWatchdog();
  /** Set when the watchdog aborted a silent watch, to say so. */
  let stalled = false;
  // The library re-lists by itself on 410; we only say so.
  const expired = (): void => log.info(`watch ${qualified(name)}: resourceVersion expired (410 Gone); listing again`);

  const watch = new SourceWatch(o.kubeConfig, {
    stopped: () => supervisor.isStopped,
    timeoutSeconds: o.timeoutSeconds,
    opened: (controller, seconds) => {
      supervisor.healthy(member);
      // Silent past the timeout the server was asked for (plus some grace):
      // the connection is dead (half-open TCP); abort, the restart resumes.
      watchdog.arm(idleLimitMs(seconds), () => {
        stalled = true;
        controller.abort();
      });
    },
    event: (type, obj) => {
      watchdog.poke();
      if (type === 'ERROR' && (obj as { code?: unknown } | undefined)?.code === 410) expired();
    },
    ended: (err) => {
      watchdog.disarm();
      if ((err as { statusCode?: unknown } | null)?.statusCode === 410) expired();
    },
  });

  const list = async (): Promise<KubernetesListObject<T>> => {
    let result: KubernetesListObject<T>;
    try {
      result = await o.list();
    } catch (err) {
      throw new ListError(err);
    }
    // The informer adds the items right after this resolves, in one tick.
    setImmediate(() => supervisor.listed(member, result.items.length));
    return result;
  };

  const failed = (err: unknown): void => {
    if (supervisor.isStopped) return;
    watchdog.disarm();
    const f = stalled ? stalledWatch(name) : err instanceof ListError ? describeKubeError(err.inner, 'list', name, o.server) : describeKubeError(err, 'watch', name, o.server);
    stalled = false;
    supervisor.failed(member, f);
  };

  const informer = new ListWatch<T>(o.path, watch, list, false, o.labelSelector, o.fieldSelector);
  informer.on('add', (obj) => o.onObject(obj, false));
  informer.on('update', (obj) => o.onObject(obj, false));
  informer.on('delete', (obj) => o.onObject(obj, true));
  informer.on('error', failed);

  const member: Member = {
    ...name,
    start: () => void informer.start().catch(failed),
    stop: () => {
      watchdog.disarm();
      void informer.stop();
    },
  };
  supervisor.add(member);
}

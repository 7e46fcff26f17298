/**
 * `kube`: the Kubernetes API as the source (src/sources/kube.ts, docs/kube.md).
 */
import type { Command } from 'commander';
import { parseNonEmpty } from '../options.js';
import type { Source } from '../source.js';
import type { CommonOptions } from '../pipeline.js';
import { serviceFilterFrom, type ServiceFilterFlags } from './common.js';

/** Raw values of kube's own options. */
export interface KubeFlags extends ServiceFilterFlags {
  kubeconfig?: string;
}

/** Adds kube's own options. */
export function addKubeOptions(cmd: Command): Command {
  return cmd
    .description("Watch the Kubernetes API (Services, EndpointSlices, this node's Node) and compute this node's state as kpng did.")
    .option(
      '--kubeconfig <path>',
      'kubeconfig file (default: $KUBECONFIG, else the in-cluster service account when $KUBERNETES_SERVICE_HOST is set, else ~/.kube/config)',
      (v: string) => parseNonEmpty('--kubeconfig', v),
    );
}

/** Builds the kube source; its modules are loaded only now (start-up time the other sources don't need). */
export async function kubeSourceFrom(o: KubeFlags, common: CommonOptions, env: NodeJS.ProcessEnv): Promise<Source> {
  const filter = serviceFilterFrom(o);
  const { createKubeSource, loadKubeConfig } = await import('../sources/kube.js');
  const { kubeConfig, from } = loadKubeConfig({ kubeconfig: o.kubeconfig, env });
  return createKubeSource({
    kubeConfig,
    configFrom: from,
    nodeName: common.nodeName,
    ...filter,
    once: common.once,
    logger: common.logger,
  });
}

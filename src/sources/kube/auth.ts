/**
 * What each request to the API server carries, from a loaded kubeconfig
 * (config.ts): the TLS options (CA, client certificate, server name,
 * insecure-skip-tls-verify) and the credentials (bearer token, token file,
 * exec plugin, basic auth, impersonation), and how to refresh them after a
 * 401.
 *
 * The common cases are handled here with the library's light modules:
 * `exec_auth.js` (ExecAuth, the exec credential plugins) and `file_auth.js`
 * (FileAuth: a token file re-read every minute, as the service account token
 * rotates), ~0.01 s to load. Anything else (auth-provider gcp, azure, oidc;
 * a proxy-url) goes through the full library's KubeConfig, imported only
 * then: it costs ~0.5 s and ~70 MB RSS (measured, Node 20), which a
 * DaemonSet pays on every node, so not on the usual paths.
 */
import { readFileSync } from 'node:fs';
import type { Agent, RequestOptions } from 'node:https';
import { ExecAuth } from '@kubernetes/client-node/dist/exec_auth.js';
import { FileAuth } from '@kubernetes/client-node/dist/file_auth.js';
import type { Cluster } from '@kubernetes/client-node/dist/config_types.js';
import type { KubeUser, LoadedKubeConfig } from './config.js';

/** The per-request part of the options of an http(s).request. */
export interface RequestAuth {
  headers: Record<string, string>;
  /** TLS options (CA, client certificate, verification); none for http:. */
  tls: Pick<RequestOptions, 'ca' | 'cert' | 'key' | 'rejectUnauthorized' | 'servername'>;
  /** An agent of the full library (a proxy agent, or one with its TLS options): used instead of ours. */
  agent?: Agent | undefined;
  /** `user:password` for basic auth, from the full library. */
  auth?: string | undefined;
}

/** The credentials of one configuration. */
export interface Credentials {
  /** `client library` when the full library is used (for logs), else `built-in`. */
  readonly via: 'built-in' | 'client library';
  /** Options for one request; reads token and certificate files as needed (they rotate). */
  forRequest(): Promise<RequestAuth>;
  /** After a 401: forgets cached tokens. True when a retry may get other credentials. */
  refresh(): boolean;
}

/** A file's bytes, else base64 data, else undefined (the library's bufferFromFileOrString). */
function fileOrData(file: string | undefined, data: string | undefined): Buffer | undefined {
  if (file) return readFileSync(file);
  if (data) return Buffer.from(data, 'base64');
  return undefined;
}

/** The user needs the full library: an auth-provider other than a token file or an exec plugin. */
function needsLibrary(cluster: Cluster | null, user: KubeUser | null): boolean {
  if (cluster?.proxyUrl) return true;
  if (!user?.authProvider) return false;
  const name = (user.authProvider as { name?: unknown }).name;
  if (name === 'azure' || name === 'gcp') return true;
  return !new ExecAuth().isAuthProvider(user) && !new FileAuth().isAuthProvider(user);
}

/** TLS and credentials handled here (see the module comment). */
class BuiltInCredentials implements Credentials {
  readonly via = 'built-in';
  private exec = new ExecAuth();
  private file = new FileAuth();
  /** The form FileAuth reads: a kubeconfig `token-file`, or the in-cluster authProvider tokenFile. */
  private readonly fileUser: KubeUser | undefined;

  constructor(
    private readonly cluster: Cluster | null,
    private readonly user: KubeUser | null,
  ) {
    const u = user;
    if (u?.tokenFile !== undefined) this.fileUser = { name: u.name, authProvider: { name: 'tokenFile', config: { tokenFile: u.tokenFile } } };
    else if (u && !this.exec.isAuthProvider(u) && this.file.isAuthProvider(u)) this.fileUser = u;
  }

  async forRequest(): Promise<RequestAuth> {
    const { cluster, user } = this;
    // A plain-HTTP server (`kubectl proxy`) is used as kubectl and client-go use it, with or without
    // insecure-skip-tls-verify (the client library alone refuses it without).
    const headers: Record<string, string> = {};
    const tls: RequestAuth['tls'] = {};
    if (cluster?.skipTLSVerify) tls.rejectUnauthorized = false;
    if (cluster?.tlsServerName) tls.servername = cluster.tlsServerName;
    const ca = cluster && fileOrData(cluster.caFile, cluster.caData);
    if (ca) tls.ca = ca;
    if (user) {
      const cert = fileOrData(user.certFile, user.certData);
      if (cert) tls.cert = cert;
      const key = fileOrData(user.keyFile, user.keyData);
      if (key) tls.key = key;
      // The library's order: the plugin or token file, then a static token wins.
      const opts: RequestOptions & { headers: Record<string, string> } = { headers };
      if (this.exec.isAuthProvider(user)) {
        await this.exec.applyAuthentication(user, opts);
        if (opts.cert) tls.cert = opts.cert;
        if (opts.key) tls.key = opts.key;
      } else if (this.fileUser) {
        await this.file.applyAuthentication(this.fileUser, opts);
        // A hand-written token file ends with a newline: client-go trims it, the library does not.
        if (headers.Authorization) headers.Authorization = headers.Authorization.trim();
      }
      if (user.token) headers.Authorization = `Bearer ${user.token}`;
      else if (user.username && !headers.Authorization) headers.Authorization = `Basic ${Buffer.from(`${user.username}:${user.password ?? ''}`).toString('base64')}`;
      if (user.impersonateUser != null) headers['Impersonate-User'] = user.impersonateUser;
    }
    return { headers, tls };
  }

  refresh(): boolean {
    if (!this.user || this.user.token) return false;
    if (this.exec.isAuthProvider(this.user)) {
      this.exec = new ExecAuth();
      return true;
    }
    if (this.fileUser) {
      this.file = new FileAuth();
      return true;
    }
    return false;
  }
}

/** Everything through the full library's KubeConfig (see the module comment). */
async function libraryCredentials(config: LoadedKubeConfig): Promise<Credentials> {
  const { KubeConfig } = await import('@kubernetes/client-node');
  const kc = new KubeConfig();
  kc.loadFromOptions({ clusters: config.clusters, users: config.users, contexts: config.contexts, currentContext: config.currentContext ?? '' });
  return {
    via: 'client library',
    async forRequest() {
      const opts: RequestOptions = { headers: {} };
      await kc.applyToHTTPSOptions(opts);
      const headers: Record<string, string> = {};
      for (const [k, v] of Object.entries(opts.headers ?? {})) if (v !== undefined) headers[k] = String(v);
      return { headers, tls: {}, agent: opts.agent as Agent, auth: opts.auth ?? undefined };
    },
    refresh: () => false,
  };
}

/** The credentials of `config`'s current context; imports the full library only when needed. */
export async function credentialsFor(config: LoadedKubeConfig): Promise<Credentials> {
  const cluster = config.getCurrentCluster();
  const user = config.getCurrentUser();
  if (needsLibrary(cluster, user)) return libraryCredentials(config);
  return new BuiltInCredentials(cluster, user);
}

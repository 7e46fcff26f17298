/**
 * Failed lists and watches in words (src/sources/kube/failures.ts), from the
 * error shapes requests reject with (src/sources/kube/http.ts).
 */
import t from 'tap';
import { describeKubeError, failureLine, NO_ANSWER, qualified, stalledWatch, type Failure } from '../../../src/sources/kube/failures.js';

const SERVER = 'https://192.0.2.1:6443';
const services = { resource: 'services', group: '' };
const slices = { resource: 'endpointslices', group: 'discovery.k8s.io' };
const status = (message: string): string => JSON.stringify({ kind: 'Status', apiVersion: 'v1', status: 'Failure', message });

t.test('RBAC names: the group qualifies non-core resources', async (t) => {
  t.equal(qualified(services), 'services');
  t.equal(qualified(slices), 'endpointslices.discovery.k8s.io');
});

t.test('HTTP statuses: 401, 403 with what to grant, others with what the server said', async (t) => {
  const unauthorized = describeKubeError({ code: 401, body: status('Unauthorized') }, 'list', services, SERVER);
  t.same(unauthorized, {
    op: 'list services',
    routine: false,
    reason: `401 Unauthorized: the API server ${SERVER} rejected the credentials (check the kubeconfig user, or the service account token) (server: Unauthorized)`,
  });
  const forbidden = describeKubeError({ code: 403, body: status('endpointslices is forbidden') }, 'watch', slices, SERVER);
  t.equal(forbidden.op, 'watch endpointslices.discovery.k8s.io');
  t.equal(
    forbidden.reason,
    '403 Forbidden: RBAC does not allow verb "watch" on resource "endpointslices" in API group "discovery.k8s.io"' +
      ' (the ClusterRole needs get, list and watch on endpointslices.discovery.k8s.io; see manifests/rbac.yaml) (server: endpointslices is forbidden)',
  );
  // A watch request's HTTP error carries `statusCode`; a body that is no Status is left out.
  t.equal(describeKubeError({ statusCode: 500, body: 'oops', message: 'Internal Server Error' }, 'watch', services, SERVER).reason, 'HTTP 500 (Internal Server Error)');
  // The library's generic "HTTP-Code: ..." message says nothing the status does not.
  t.equal(describeKubeError({ code: 503, message: 'HTTP-Code: 503\nMessage: ...' }, 'list', services, SERVER).reason, 'HTTP 503');
  t.equal(describeKubeError({ code: 500, body: status('etcd is down'), message: 'x' }, 'list', services, SERVER).reason, 'HTTP 500 (server: etcd is down)');
});

t.test('network errors: unreachable (the errno kept), a lost connection is routine', async (t) => {
  t.same(describeKubeError({ code: 'ECONNREFUSED', message: 'connect ECONNREFUSED' }, 'list', services, SERVER), {
    op: 'list services',
    routine: false,
    reason: 'connection refused',
    unreachable: 'ECONNREFUSED',
  });
  // fetch puts the errno in `cause`.
  const dns = describeKubeError(Object.assign(new TypeError('fetch failed'), { cause: { code: 'ENOTFOUND' } }), 'list', services, SERVER);
  t.same([dns.reason, dns.unreachable], ['host not found', 'ENOTFOUND']);
  t.same(describeKubeError({ code: 'ERR_STREAM_PREMATURE_CLOSE' }, 'watch', slices, SERVER), {
    op: 'watch endpointslices.discovery.k8s.io',
    routine: true,
    reason: `connection to ${SERVER} lost`,
  });
  t.equal(describeKubeError(new Error('something odd\nand its details'), 'list', services, SERVER).reason, 'something odd');
  t.equal(describeKubeError('a string', 'list', services, SERVER).reason, 'a string');
});

t.test('TLS verification errors name the server, the errno and what to check', async (t) => {
  const f = describeKubeError(Object.assign(new Error('unable to verify the first certificate'), { code: 'UNABLE_TO_VERIFY_LEAF_SIGNATURE' }), 'list', services, SERVER);
  t.equal(f.routine, false);
  t.equal(f.unreachable, undefined);
  t.match(f.reason, `the API server ${SERVER}'s TLS certificate is not trusted: unable to verify the first certificate (UNABLE_TO_VERIFY_LEAF_SIGNATURE); check the cluster's certificate-authority`);
  const alt = describeKubeError(Object.assign(new Error("Hostname/IP does not match certificate's altnames: IP: 192.0.2.1 is not in the cert's list: 192.0.2.2"), { code: 'ERR_TLS_CERT_ALTNAME_INVALID' }), 'watch', slices, SERVER);
  t.match(alt.reason, /not trusted: Hostname\/IP does not match .* \(ERR_TLS_CERT_ALTNAME_INVALID\); check .*tls-server-name/);
});

t.test('a stalled watch is routine', async (t) => {
  t.same(stalledWatch(slices), { op: 'watch endpointslices.discovery.k8s.io', reason: 'no event for longer than the watch timeout', routine: true });
});

t.test('one line per attempt: the same reason together, in order', async (t) => {
  const refused = (op: string): Failure => ({ op, reason: 'connection refused', unreachable: 'ECONNREFUSED', routine: false });
  t.equal(
    failureLine([refused('list services'), refused('list endpointslices.discovery.k8s.io'), refused('list nodes')], SERVER),
    `cannot reach the Kubernetes API server ${SERVER}: connection refused (ECONNREFUSED; list services, list endpointslices.discovery.k8s.io, list nodes)`,
  );
  const lost = (op: string): Failure => ({ op, reason: 'connection lost', routine: true });
  t.equal(
    failureLine([lost('watch services'), { op: 'list nodes', reason: '403 Forbidden', routine: false }, lost('watch endpointslices.discovery.k8s.io')], SERVER),
    'watch services, watch endpointslices.discovery.k8s.io: connection lost; list nodes: 403 Forbidden',
  );
});

t.test('a connected server that sends nothing is not "cannot reach": the timeout says so, with the server', async (t) => {
  const f = describeKubeError(Object.assign(new Error('the API server accepted the connection but sent no answer in 60 s'), { code: NO_ANSWER }), 'list', services, SERVER);
  t.equal(f.unreachable, undefined);
  t.equal(f.reason, `the API server accepted the connection but sent no answer in 60 s (${SERVER})`);
  const down = describeKubeError(Object.assign(new Error('no connection in 60 s'), { code: 'ETIMEDOUT' }), 'list', services, SERVER);
  t.equal(down.unreachable, 'ETIMEDOUT', 'no connection: unreachable');
});

t.test('a TLS alert about our client certificate blames the client certificate, not the server CA', async (t) => {
  const f = describeKubeError(Object.assign(new Error('tlsv13 alert certificate required'), { code: 'ERR_SSL_TLSV13_ALERT_CERTIFICATE_REQUIRED' }), 'list', services, SERVER);
  t.equal(f.reason, `the API server ${SERVER} refused our client certificate: tlsv13 alert certificate required (ERR_SSL_TLSV13_ALERT_CERTIFICATE_REQUIRED); check client-certificate and client-key in the kubeconfig`);
  t.notMatch(describeKubeError(Object.assign(new Error('x'), { code: 'ERR_TLS_HANDSHAKE_TIMEOUT' }), 'list', services, SERVER).reason, /not trusted/, 'another TLS error is not a CA problem');
});

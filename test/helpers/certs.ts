/**
 * Throw-away TLS material made with the `openssl` command at test time:
 * a CA, a server certificate for 127.0.0.1 and a client certificate.
 */
import { execFileSync } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { tempDir, untilExit, type Owner } from './files.js';

export interface TestCerts {
  dir: string;
  ca: Buffer;
  serverCert: Buffer;
  serverKey: Buffer;
  clientCert: Buffer;
  clientKey: Buffer;
  /** A second CA, which signed nothing here. */
  otherCa: Buffer;
}

/** Why certificates cannot be made here, or undefined when they can. */
export function opensslMissing(): string | undefined {
  try {
    execFileSync('openssl', ['version'], { stdio: 'ignore' });
    return undefined;
  } catch (err) {
    return `openssl is not available (${(err as Error).message})`;
  }
}

/** Makes the certificates in a temp dir removed at `owner`'s teardown (default: when the process exits). */
export function makeCerts(owner: Owner = untilExit): TestCerts {
  const dir = tempDir(owner, 'kpng-certs-');
  const f = (name: string): string => join(dir, name);
  const ossl = (...args: string[]): void => void execFileSync('openssl', args, { stdio: 'pipe' });
  const ec = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes'];
  const ca = (name: string): void =>
    ossl('req', '-x509', ...ec, '-keyout', f(`${name}.key`), '-out', f(`${name}.crt`), '-days', '2', '-subj', `/CN=${name}`,
      '-addext', 'basicConstraints=critical,CA:TRUE', '-addext', 'keyUsage=critical,keyCertSign,cRLSign');
  ca('ca');
  ca('other-ca');
  const leaf = (name: string, ext: string): void => {
    ossl('req', ...ec, '-keyout', f(`${name}.key`), '-out', f(`${name}.csr`), '-subj', `/CN=${name}`);
    writeFileSync(f(`${name}.ext`), ext);
    ossl('x509', '-req', '-in', f(`${name}.csr`), '-CA', f('ca.crt'), '-CAkey', f('ca.key'), '-CAcreateserial',
      '-out', f(`${name}.crt`), '-days', '2', '-extfile', f(`${name}.ext`));
  };
  leaf('server', 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n');
  leaf('client', 'extendedKeyUsage=clientAuth\n');
  const r = (name: string): Buffer => readFileSync(f(name));
  return {
    dir,
    ca: r('ca.crt'),
    otherCa: r('other-ca.crt'),
    serverCert: r('server.crt'),
    serverKey: r('server.key'),
    clientCert: r('client.crt'),
    clientKey: r('client.key'),
  };
}

// Runs every tests/compat/mongosh/*.js with the real mongosh against a fresh shoal server.
// A script passes when mongosh exits 0 (scripts throw or assert on failure).
import { execFileSync, spawn } from 'node:child_process';
import { mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { startCluster, startServer } from './lib/server.mjs';

const SCRIPT_TIMEOUT_MS = 180_000;
const here = path.dirname(fileURLToPath(import.meta.url));
const scriptsDir = path.resolve(here, '..', 'mongosh');
const mongosh = path.join(here, 'node_modules', '.bin', 'mongosh');

// Private HOME and config: no telemetry, no update checks, nothing but 127.0.0.1.
const home = mkdtempSync(path.join(os.tmpdir(), 'shoal-mongosh-home-'));
const globalConfig = path.join(home, 'mongosh.conf');
writeFileSync(globalConfig, 'mongosh:\n  forceDisableTelemetry: true\n  updateURL: ""\n');
const env = {
  ...process.env,
  HOME: home,
  MONGOSH_FORCE_DISABLE_TELEMETRY_FOR_TESTING: '1',
  MONGOSH_GLOBAL_CONFIG_FILE_FOR_TESTING: globalConfig,
};

// Scripts named replset_*.js each get their own server started with --replSet rs0,
// auth_*.js one started with --auth, tls_*.js one with --auth that requires TLS (with a
// CA made for the run; mongosh connects with it and the script finds it in
// SHOAL_TLS_CA_FILE), sharded_*.js a cluster of two shards behind a router (`shoal cluster
// up`), sharded_auth_tls_*.js one with --auth (a keyFile) whose members and router require
// TLS. The others share one standalone.
const certDir = mkdtempSync(path.join(os.tmpdir(), 'shoal-mongosh-certs-'));
const ca = path.join(certDir, 'ca.pem');
const OWN_SERVER = {
  replset_: { args: ['--replSet', 'rs0'], shell: [] },
  auth_: { args: ['--auth'], shell: [] },
  tls_: { args: ['--auth', '--tlsMode', 'requireTLS', '--tlsCertificateKeyFile', path.join(certDir, 'server.pem')], shell: ['--tls', '--tlsCAFile', ca] },
  sharded_auth_tls_: {
    cluster: 2,
    args: ['--auth', '--tlsMode', 'requireTLS', '--tlsCertificateKeyFile', path.join(certDir, 'server.pem'), '--tlsCAFile', ca],
    shell: ['--tls', '--tlsCAFile', ca, '--tlsCertificateKeyFile', path.join(certDir, 'client.pem')],
  },
  sharded_: { cluster: 2, shell: [] },
};

function run(uri, file, shellArgs) {
  return new Promise((resolve) => {
    const child = spawn(mongosh, [`${uri}test`, '--quiet', ...shellArgs, '--file', file], { env: { ...env, SHOAL_TLS_CA_FILE: ca, SHOAL_TLS_CLIENT_FILE: path.join(certDir, 'client.pem') }, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    child.stdout.on('data', (d) => { out += d; });
    child.stderr.on('data', (d) => { out += d; });
    const timer = setTimeout(() => { out += `\n<timed out after ${SCRIPT_TIMEOUT_MS} ms>`; child.kill('SIGKILL'); }, SCRIPT_TIMEOUT_MS);
    child.on('close', (code) => { clearTimeout(timer); resolve({ code, out }); });
  });
}

execFileSync('bash', [path.resolve(here, '..', 'make_test_certs.sh'), certDir]);
const scripts = readdirSync(scriptsDir).filter((f) => f.endsWith('.js')).sort();
let passed = 0;
let failed = 0;
const server = await startServer();
try {
  for (const name of scripts) {
    const prefix = Object.keys(OWN_SERVER).find((p) => name.startsWith(p));
    const spec = prefix ? OWN_SERVER[prefix] : null;
    const own = spec ? await (spec.cluster ? startCluster(spec.cluster, spec.args ?? []) : startServer(spec.args)) : null;
    const { code, out } = await run((own ?? server).uri, path.join(scriptsDir, name), prefix ? OWN_SERVER[prefix].shell : []);
    if (own) await own.stop();
    if (code === 0) {
      passed++;
      console.log(`ok - mongosh ${name}`);
    } else {
      failed++;
      console.log(`not ok - mongosh ${name} (exit ${code})`);
      console.log(out.split('\n').map((l) => `    ${l}`).join('\n'));
    }
  }
} finally {
  await server.stop();
  rmSync(home, { recursive: true, force: true });
  rmSync(certDir, { recursive: true, force: true });
}
console.log(`mongosh: ${passed} passed, ${failed} failed`);
process.exit(failed === 0 && passed > 0 ? 0 : 1);

// Runs every tests/compat/mongosh/*.js with the real mongosh against a fresh shoal server.
// A script passes when mongosh exits 0 (scripts throw or assert on failure).
import { spawn } from 'node:child_process';
import { mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { startServer } from './lib/server.mjs';

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
// auth_*.js one started with --auth; the others share one standalone.
const OWN_SERVER_ARGS = { replset_: ['--replSet', 'rs0'], auth_: ['--auth'] };

function run(uri, file) {
  return new Promise((resolve) => {
    const child = spawn(mongosh, [`${uri}test`, '--quiet', '--file', file], { env, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    child.stdout.on('data', (d) => { out += d; });
    child.stderr.on('data', (d) => { out += d; });
    const timer = setTimeout(() => { out += `\n<timed out after ${SCRIPT_TIMEOUT_MS} ms>`; child.kill('SIGKILL'); }, SCRIPT_TIMEOUT_MS);
    child.on('close', (code) => { clearTimeout(timer); resolve({ code, out }); });
  });
}

const scripts = readdirSync(scriptsDir).filter((f) => f.endsWith('.js')).sort();
let passed = 0;
let failed = 0;
const server = await startServer();
try {
  for (const name of scripts) {
    const prefix = Object.keys(OWN_SERVER_ARGS).find((p) => name.startsWith(p));
    const own = prefix ? await startServer(OWN_SERVER_ARGS[prefix]) : null;
    const { code, out } = await run((own ?? server).uri, path.join(scriptsDir, name));
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
}
console.log(`mongosh: ${passed} passed, ${failed} failed`);
process.exit(failed === 0 && passed > 0 ? 0 : 1);

// Starts the real shoal binary on a free loopback port with a fresh dbpath.
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync, openSync, readFileSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const READY_TIMEOUT_MS = 20_000;
const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..', '..', '..');

export function shoalBin() {
  return process.env.SHOAL_BIN || path.join(repo, 'target', 'debug', 'shoal');
}

function freePort() {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.unref();
    srv.on('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

// The first of `n` consecutive free loopback ports, below the kernel's ephemeral range
// (32768 and up), where a client connection's own end may otherwise take one of them between
// this check and the cluster's start.
async function freePortBlock(n) {
  const canListen = (port) => new Promise((resolve) => {
    const srv = net.createServer();
    srv.once('error', () => resolve(false));
    srv.listen(port, '127.0.0.1', () => srv.close(() => resolve(true)));
  });
  for (let attempt = 0; attempt < 200; attempt++) {
    const first = 22000 + Math.floor(Math.random() * (32700 - n - 22000));
    let free = true;
    for (let p = first; p < first + n && free; p++) free = await canListen(p);
    if (free) return first;
  }
  throw new Error(`no ${n} consecutive free ports below 32700`);
}

function canConnect(port) {
  return new Promise((resolve) => {
    const s = net.connect({ port, host: '127.0.0.1' });
    s.once('connect', () => { s.destroy(); resolve(true); });
    s.once('error', () => resolve(false));
  });
}

export async function startServer(extraArgs = []) {
  const root = mkdtempSync(path.join(os.tmpdir(), 'shoal-node-'));
  const dbpath = path.join(root, 'db');
  const { mkdirSync } = await import('node:fs');
  mkdirSync(dbpath);
  const stderrPath = path.join(root, 'stderr.log');
  const port = await freePort();
  const child = spawn(shoalBin(), ['serve', '--port', String(port), '--bind_ip', '127.0.0.1', '--dbpath', dbpath, ...extraArgs], {
    stdio: ['ignore', 'ignore', openSync(stderrPath, 'w')],
  });
  let exited = null;
  child.on('exit', (code, signal) => { exited = `code ${code} signal ${signal}`; });
  const deadline = Date.now() + READY_TIMEOUT_MS;
  for (;;) {
    if (await canConnect(port)) break;
    const stderr = () => { try { return readFileSync(stderrPath, 'utf8').slice(-8000); } catch { return ''; } };
    if (exited) throw new Error(`shoal exited (${exited}):\n${stderr()}`);
    if (Date.now() > deadline) { child.kill('SIGKILL'); throw new Error(`shoal not ready in ${READY_TIMEOUT_MS} ms:\n${stderr()}`); }
    await new Promise((r) => setTimeout(r, 25));
  }
  return {
    port,
    uri: `mongodb://127.0.0.1:${port}/`,
    async stop() {
      if (!exited) {
        const done = new Promise((r) => child.once('exit', r));
        child.kill('SIGKILL');
        await done;
      }
      rmSync(root, { recursive: true, force: true });
    },
  };
}

// Starts a sharded cluster with `shoal cluster up`: config servers, `shards` one-member shard
// sets and a router, on consecutive free loopback ports from the router's.
export async function startCluster(shards = 2, args = []) {
  const { execFileSync } = await import('node:child_process');
  const root = mkdtempSync(path.join(os.tmpdir(), 'shoal-cluster-'));
  const port = await freePortBlock(shards + 2);
  execFileSync(shoalBin(), ['cluster', 'up', '--shards', String(shards), '--port', String(port), '--dir', root, ...args], { stdio: ['ignore', 'ignore', 'inherit'] });
  return {
    port,
    uri: `mongodb://127.0.0.1:${port}/`,
    async stop() {
      try { execFileSync(shoalBin(), ['cluster', 'down', '--dir', root], { stdio: 'ignore' }); } catch { /* stopped already */ }
      rmSync(root, { recursive: true, force: true });
    },
  };
}

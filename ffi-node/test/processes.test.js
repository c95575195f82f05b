'use strict'
// Processes: one Node process publishes, another finds, pins and verifies
// every byte; inbox round trips between two Node processes, and between
// Node and a Python peer. Every wait is bounded.
const { test } = require('node:test')
const assert = require('node:assert/strict')
const { fork, spawn } = require('node:child_process')
const fs = require('node:fs')
const path = require('node:path')
const readline = require('node:readline')
const { cxlkv, smallRegion, pattern, key } = require('./helpers')

const NS = 11
const WATCHDOG_MS = 60_000

/** A forked Node child in `role`, with its messages as a queue. */
function child(file, local, role) {
  const proc = fork(path.join(__dirname, 'child.js'), [file, local, role], { stdio: ['ignore', 'inherit', 'inherit', 'ipc'] })
  const queue = []
  const waiters = []
  proc.on('message', (m) => (waiters.length ? waiters.shift()(m) : queue.push(m)))
  const timer = setTimeout(() => proc.kill('SIGKILL'), WATCHDOG_MS)
  proc.on('exit', () => clearTimeout(timer))
  const next = () =>
    new Promise((resolve, reject) => {
      const take = (m) => (m.error ? reject(new Error(`${role} failed: ${m.error}`)) : resolve(m))
      if (queue.length) return take(queue.shift())
      const t = setTimeout(() => reject(new Error(`${role}: no message within ${WATCHDOG_MS} ms`)), WATCHDOG_MS)
      waiters.push((m) => {
        clearTimeout(t)
        take(m)
      })
    })
  const exited = new Promise((resolve) => proc.on('exit', (code, sig) => resolve({ code, sig })))
  return { proc, next, exited }
}

test('a block one process publishes, another finds, pins and verifies byte for byte', { timeout: 120_000 }, async () => {
  const { file, region, local } = smallRegion('fork', 64 << 20)
  const node = region.attach({ localDir: local })
  const c = child(file, local, 'reader')
  const { ready } = await c.next()
  assert.notEqual(ready, node.id)
  const n = 48
  const size = 64 << 10
  c.proc.send({ n, size })
  // Publish in two steps, so the reader sees a partial prefix first.
  for (let i = 0; i < n; i++) {
    const r = node.reserve(NS, [key(i)], size, 16)
    new Uint8Array(r.view(0)).set(pattern(i, size))
    assert.deepEqual(r.publish(), ['OK'])
    if (i === n / 2) await new Promise((res) => setTimeout(res, 5))
  }
  const { done } = await c.next()
  assert.deepEqual({ verified: done.verified, bad: done.bad }, { verified: n, bad: 0 })
  assert.equal((await c.exited).code, 0)
  assert.deepEqual(node.check(), [])
  node.detach()
})

test('inbox round trip between two Node processes', { timeout: 120_000 }, async () => {
  const { file, region, local } = smallRegion('rpc')
  const node = region.attach({ localDir: local })
  const c = child(file, local, 'server')
  const { ready: peer } = await c.next()
  for (let i = 0; i < 20; i++) {
    const ans = await node.callAsync(peer, { kind: 4, status: i, stamp: BigInt(1000 + i), keys: [key(i)] }, WATCHDOG_MS)
    assert.equal(ans.status, i + 1)
    assert.equal(ans.from, peer)
    assert.deepEqual(ans.keys, [keyOf(BigInt(1000 + i)), key(i)])
  }
  // The sync form, from the same process.
  const ans = node.call(peer, { kind: 4, status: 41, stamp: 5n }, WATCHDOG_MS)
  assert.equal(ans.status, 42)
  node.send(peer, { kind: 99 })
  assert.deepEqual((await c.next()).done, { served: true })
  assert.equal((await c.exited).code, 0)
  node.detach()
})

/** A bigint key as its 16 little-endian bytes. */
function keyOf(x) {
  const b = Buffer.alloc(16)
  b.writeBigUInt64LE(x & 0xffffffffffffffffn, 0)
  b.writeBigUInt64LE(x >> 64n, 8)
  return b
}

/** The Python of the repository's virtual environment (with cxlkv installed). */
function python() {
  const candidates = [process.env.CXLKV_PYTHON, path.join(__dirname, '../../.venv/bin/python')]
  return candidates.find((p) => p && fs.existsSync(p))
}

test('inbox round trips with a Python peer; keys and namespaces agree across languages', { timeout: 120_000 }, async (t) => {
  const py = python()
  if (!py) {
    t.skip('no Python with cxlkv here (set CXLKV_PYTHON, or run ffi-python/tests/run.sh first)')
    return
  }
  const { file, region, local } = smallRegion('py')
  const node = region.attach({ localDir: local })
  const proc = spawn(py, [path.join(__dirname, 'peer.py'), file, local], { stdio: ['pipe', 'pipe', 'inherit'] })
  const timer = setTimeout(() => proc.kill('SIGKILL'), WATCHDOG_MS)
  const exited = new Promise((resolve) => proc.on('exit', (code) => resolve(code)))
  const lines = readline.createInterface({ input: proc.stdout })[Symbol.asyncIterator]()
  const line = async () => (await lines.next()).value.split(' ')

  const [tag, id, ns, digest, ...pyKeys] = await line()
  assert.equal(tag, 'ready')
  const peer = Number(id)
  const fields = { model: 'llama', kvLayout: 1, dtype: 2, tpRank: 1, tpSize: 2, blockTokens: 16, extra: 7, salt: 'tenant-a' }
  assert.equal(cxlkv.namespaceDigest(fields).toString('hex'), digest)
  assert.equal(node.namespace(fields), Number(ns), 'registered by Python, found by Node')
  const tokens = Array.from({ length: 64 }, (_, i) => i)
  assert.deepEqual(cxlkv.chainKeys(tokens, 16).map((k) => k.toString('hex')), pyKeys)

  // Node calls Python.
  const ans = await node.callAsync(peer, { kind: 4, status: 1, stamp: 55n, keys: [key(3)] }, WATCHDOG_MS)
  assert.equal(ans.status, 2)
  assert.equal(ans.from, peer)
  assert.deepEqual(ans.keys, [keyOf(55n), key(3)])
  // Python calls Node.
  proc.stdin.write(`${node.id}\n`)
  const req = await node.recvAsync(WATCHDOG_MS)
  assert.deepEqual([req.kind, req.status, req.stamp, req.from], [21, 8, 77n, peer])
  node.reply(req, 9, [key(7), ...req.keys])
  const [tag2, status, kind, from, ...keys] = await line()
  assert.deepEqual([tag2, Number(status), Number(kind), Number(from)], ['answer', 9, (21 | 0x80000000) >>> 0, node.id])
  assert.deepEqual(keys, [key(7).toString('hex'), '05'.repeat(16)])
  assert.equal(await exited, 0)
  clearTimeout(timer)
  node.detach()
})

'use strict'
// Zero-copy views: over the region's bytes, detached when their pins or
// reservations end, a finalizer as the safety net, copies where the runtime
// refuses external buffers.
const { test } = require('node:test')
const assert = require('node:assert/strict')
const { execFileSync } = require('node:child_process')
const { MessageChannel } = require('node:worker_threads')
const v8 = require('node:v8')
const vm = require('node:vm')
const { cxlkv, smallRegion, throwsCode, key } = require('./helpers')

const NS = 3

v8.setFlagsFromString('--expose-gc')
const gc = vm.runInNewContext('gc')

test('two views of one block share its memory, which is the region', () => {
  const { region, local, file } = smallRegion('share')
  const n = region.attach({ localDir: local })
  n.put(NS, [key(1)], [Buffer.from('shared bytes')])
  const p1 = n.acquire(NS, [key(1)])
  const p2 = n.acquire(NS, [key(1)])
  const v1 = new Uint8Array(p1.view(0))
  const v2 = new Uint8Array(p2.view(0))
  assert.equal(p1.offsets[0], p2.offsets[0])
  assert.notEqual(p1.view(0), p2.view(0)) // two ArrayBuffers ...
  assert.equal(p1.view(0), p1.view(0)) // ... each handed out once per batch
  // A write through one is seen through the other (restored at once: a
  // pinned view is not for writing).
  v1[0] ^= 0xff
  assert.equal(v2[0], 's'.charCodeAt(0) ^ 0xff)
  // ... and in the region file itself, at the block's offset.
  const other = cxlkv.Region.open(file)
  const n2 = other.attach({ localDir: local })
  const out = Buffer.alloc(12)
  n2.get(NS, [key(1)], [out])
  assert.equal(out[0], 's'.charCodeAt(0) ^ 0xff)
  v1[0] ^= 0xff
  assert.equal(Buffer.from(p2.view(0)).toString(), 'shared bytes')
  p1.release()
  p2.release()
  n2.detach()
  n.detach()
})

test('release, publish and abort detach every view they handed out', () => {
  const { region, local } = smallRegion('detach')
  const n = region.attach({ localDir: local })
  n.put(NS, [key(1), key(2)], [Buffer.alloc(4096, 1), Buffer.alloc(100, 2)])
  const p = n.acquire(NS, [key(1), key(2)])
  const [a, b] = p.views()
  const typed = new Uint32Array(a)
  const buf = Buffer.from(b) // a Buffer over the same memory
  assert.equal(typed.length, 1024)
  assert.equal(buf.length, 100)
  p.release()
  assert.equal(a.byteLength, 0)
  assert.equal(b.byteLength, 0)
  assert.equal(typed.length, 0)
  assert.equal(buf.length, 0)
  assert.equal(typed[0], undefined) // reads nothing, never freed memory
  assert.equal(a.detached ?? true, true)
  const r = n.reserve(NS, [key(3), key(4)], 64)
  const w = new Uint8Array(r.view(0))
  w.fill(7)
  r.publish()
  assert.equal(w.length, 0)
  const r2 = n.reserve(NS, [key(5)], 64)
  const w2 = r2.view(0)
  r2.abort()
  assert.equal(w2.byteLength, 0)
  const got = Buffer.alloc(64)
  n.get(NS, [key(3)], [got])
  assert.ok(got.every((x) => x === 7))
  n.detach()
})

test('an unreleased batch is released once it and its views were collected', async () => {
  const { region, local } = smallRegion('gc')
  const n = region.attach({ localDir: local })
  n.put(NS, [key(1)], [Buffer.from('held')])
  ;(() => {
    const p = n.acquire(NS, [key(1)])
    assert.equal(Buffer.from(p.view(0)).toString(), 'held')
    n.reserve(NS, [key(2)], 16).view(0)
  })()
  // The pins hold the node; collection ends them (finalizers run between
  // turns of the event loop). A watchdog bounds the wait.
  const deadline = Date.now() + 20_000
  for (;;) {
    gc()
    await new Promise((r) => setImmediate(r))
    try {
      n.detach()
      break
    } catch (e) {
      assert.equal(e.code, 'BUSY')
      if (Date.now() > deadline) throw new Error('the batches were never released after collection')
    }
  }
  // The abandoned reservation was aborted, not published.
  const m = region.attach({ localDir: local })
  assert.equal(m.exists(NS, key(2)), false)
  assert.equal(m.exists(NS, key(1)), true)
  assert.deepEqual(m.check(), [])
  m.detach()
})

test('posting a view copies it: the original stays detachable by release', () => {
  const { region, local } = smallRegion('post')
  const n = region.attach({ localDir: local })
  n.put(NS, [key(1)], [Buffer.from('post me')])
  const p = n.acquire(NS, [key(1)])
  const v = p.view(0)
  const { port1, port2 } = new MessageChannel()
  try {
    port1.postMessage(v, [v])
  } catch (e) {
    // Refusing the transfer is as good: the view stays where it was.
    assert.equal(e.name, 'DataCloneError')
  }
  port1.close()
  port2.close()
  assert.equal(v.byteLength, 7)
  p.release()
  assert.equal(v.byteLength, 0)
  n.detach()
})

test('where external buffers are refused: read views are copies, writable views an error', () => {
  const script = `
    const assert = require('node:assert/strict')
    const { cxlkv, smallRegion, throwsCode, key } = require(${JSON.stringify(require.resolve('./helpers'))})
    const { region, local } = smallRegion('copies')
    const n = region.attach({ localDir: local })
    n.put(3, [key(1)], [Buffer.from('copy')])
    const p = n.acquire(3, [key(1)])
    const v = p.view(0)
    assert.equal(Buffer.from(v).toString(), 'copy')
    new Uint8Array(v)[0] = 0x43 // a copy: the stored block is unchanged
    const out = Buffer.alloc(4)
    n.get(3, [key(1)], [out])
    assert.equal(out.toString(), 'copy')
    p.release()
    assert.equal(v.byteLength, 0)
    const r = n.reserve(3, [key(2)], 8)
    throwsCode(() => r.view(0), Error, 'UNSUPPORTED')
    r.abort()
    n.put(3, [key(2)], [Buffer.from('put works')])
    assert.equal(n.exists(3, key(2)), true)
    n.detach()
    console.log('copy path ok')
  `
  const out = execFileSync(process.execPath, ['-e', script], {
    env: { ...process.env, CXLKV_NODE_NO_EXTERNAL_BUFFERS: '1' },
    encoding: 'utf8',
    timeout: 60_000,
  })
  assert.match(out, /copy path ok/)
})

test('views refuse bad indices and closed batches', () => {
  const { region, local } = smallRegion('index')
  const n = region.attach({ localDir: local })
  n.put(NS, [key(1)], [Buffer.from('x')])
  const p = n.acquire(NS, [key(1)])
  throwsCode(() => p.view(1), RangeError, 'INVALID_ARGUMENT')
  throwsCode(() => p.view('0'), TypeError, 'INVALID_ARGUMENT')
  throwsCode(() => p.view(0.5), RangeError, 'INVALID_ARGUMENT')
  p.release()
  throwsCode(() => p.views(), Error, 'STALE_HANDLE')
  n.detach()
})

'use strict'
// The async forms run off the event loop: timers keep firing while they
// work, and results are the sync forms' results.
const { test } = require('node:test')
const assert = require('node:assert/strict')
const { smallRegion, pattern, key } = require('./helpers')

const NS = 5

test('a receive waits off the event loop: the message a timer sends arrives', { timeout: 60_000 }, async () => {
  const { region, local } = smallRegion('recv')
  const a = region.attach({ localDir: local })
  const b = region.attach({ localDir: local })
  // The message is sent by a timer callback: if recvAsync held the event
  // loop, the timer could not run and the receive would time out.
  const pending = b.recvAsync(30_000)
  setTimeout(() => a.send(b.id, { kind: 8, stamp: 1n }), 20)
  const m = await pending
  assert.equal(m.kind, 8)
  // A call waits off the loop too: the answer comes from a timer.
  const answered = a.callAsync(b.id, { kind: 9 }, 30_000)
  setTimeout(() => b.reply(b.recv(30_000), 3), 20)
  assert.equal((await answered).status, 3)
  a.detach()
  b.detach()
})

test('pending receives hold no libuv pool thread: a file read completes while four wait', { timeout: 60_000 }, async () => {
  const { region, local } = smallRegion('pool')
  const a = region.attach({ localDir: local })
  const b = region.attach({ localDir: local })
  // Four receives: as many as libuv's pool has threads by default.
  let settled = 0
  const pending = Array.from({ length: 4 }, () => b.recvAsync(20_000).finally(() => settled++))
  // fs.readFile runs on the pool: it must not wait for the receives.
  const text = await require('node:fs/promises').readFile(__filename, 'utf8')
  assert.ok(text.includes('pending receives hold no libuv pool thread'))
  assert.equal(settled, 0, 'the file read waited until a receive gave up')
  for (let i = 0; i < 4; i++) a.send(b.id, { kind: 20 + i })
  const got = await Promise.all(pending)
  assert.deepEqual(got.map((m) => m.kind).sort(), [20, 21, 22, 23])
  a.detach()
  b.detach()
})

test('a process exits at once with a receive pending', { timeout: 60_000 }, async () => {
  const { file, local } = smallRegion('exit')
  const { spawn } = require('node:child_process')
  const script = `
    const cxlkv = require(${JSON.stringify(require.resolve('..'))})
    const region = cxlkv.Region.open(${JSON.stringify(file)})
    const n = region.attach({ localDir: ${JSON.stringify(local)} })
    n.recvAsync(40000).catch(() => {})
    setTimeout(() => process.exit(3), 200)
  `
  const child = spawn(process.execPath, ['-e', script], { stdio: ['ignore', 'inherit', 'inherit'] })
  // Exit status 3 well before the receive's 40 s: the exit did not wait
  // for it (the watchdog below kills a child that hangs).
  const code = await new Promise((resolve) => {
    const watchdog = setTimeout(() => child.kill('SIGKILL'), 30_000)
    child.on('exit', (c, sig) => {
      clearTimeout(watchdog)
      resolve(sig ?? c)
    })
  })
  assert.equal(code, 3)
})

test('a timer keeps firing during a large batch get', { timeout: 120_000 }, async () => {
  const { region, local } = smallRegion('big', 320 << 20)
  const n = region.attach({ localDir: local })
  const size = 2 << 20
  const count = 96 // 192 MiB in one call
  const keys = Array.from({ length: count }, (_, i) => key(i))
  const bodies = keys.map((_, i) => pattern(i, size))
  assert.ok((await n.putAsync(NS, keys, bodies)).every((r) => r === 'OK'))
  const out = keys.map(() => Buffer.alloc(size))
  let ticks = 0
  let settled = false
  const tick = () => {
    if (!settled) {
      ticks++
      setImmediate(tick)
    }
  }
  setImmediate(tick)
  const got = await n.getAsync(NS, keys, out)
  settled = true
  assert.ok(ticks > 0, 'no timer ran while the get was copying')
  assert.ok(got.every((g) => g.result === 'OK' && g.length === size))
  out.forEach((b, i) => assert.ok(b.equals(bodies[i]), `block ${i}`))
  n.detach()
})

test('async calls in parallel on the libuv pool give the sync results', { timeout: 60_000 }, async () => {
  const { region, local } = smallRegion('parallel')
  const n = region.attach({ localDir: local })
  const jobs = []
  const all = []
  for (let t = 0; t < 8; t++) {
    const keys = Array.from({ length: 16 }, (_, i) => key(t * 100 + i))
    const bodies = keys.map((_, i) => pattern(t * 100 + i, 4096))
    all.push(...keys.map((k, i) => [k, bodies[i]]))
    jobs.push(
      n.putAsync(NS, keys, bodies).then(async (r) => {
        assert.ok(r.every((x) => x === 'OK'))
        const out = keys.map(() => Buffer.alloc(4096))
        const got = await n.getAsync(NS, keys, out)
        // A recovery runs beside: a read may miss while it relinks the
        // buckets (a miss, never wrong bytes).
        got.forEach((g, i) => {
          assert.ok(g.result === 'OK' || g.result === 'NOT_FOUND', g.result)
          if (g.result === 'OK') assert.ok(out[i].equals(bodies[i]))
        })
      }),
    )
  }
  jobs.push(n.recoverAsync().then((r) => assert.equal(r.nodesFreed, 0)))
  await Promise.all(jobs)
  // Every block stored is there once recovery is done.
  const out = all.map(() => Buffer.alloc(4096))
  const got = await n.getAsync(NS, all.map(([k]) => k), out)
  assert.ok(got.every((g) => g.result === 'OK'))
  out.forEach((b, i) => assert.ok(b.equals(all[i][1])))
  assert.equal(n.stats().liveBlocks, 128)
  // A check is exact on a quiescent region (in-flight changes would show).
  assert.deepEqual(await n.checkAsync(), [])
  // While async calls hold the node, it cannot detach.
  const busy = n.getAsync(NS, [key(0)], [Buffer.alloc(4096)])
  assert.throws(() => n.detach(), (e) => e.code === 'BUSY')
  await busy
  n.detach()
})

'use strict'
// Tenants: quotas held by evicting a tenant's own blocks, two tenants never
// sharing a block, listing, a live change of limits, and a whole drop.
const { test } = require('node:test')
const assert = require('node:assert/strict')
const { smallRegion, key } = require('./helpers')

const throwsResult = (fn, code) =>
  assert.throws(fn, (e) => {
    assert.equal(e.code, code, e.message)
    return true
  })

test('tenants keep their quotas and shares, and drop whole', () => {
  const { region, local } = smallRegion('tenants')
  const a = region.attach({ localDir: local })
  const b = region.attach({ localDir: local })
  try {
    a.tenantAdd('busy', { quota: 64 * 1024, priority: 2 })
    b.tenantAdd('quiet', { share: 8 * 1024 })
    throwsResult(() => b.tenantAdd('busy'), 'EXISTS')
    throwsResult(() => b.tenantAdd('a-name-longer-than-twenty'), 'INVALID_ARGUMENT')
    assert.throws(() => b.tenantAdd('x', { ttl: 5 }), TypeError)
    const model = { model: 'tenant-model' }
    const nb = a.namespaceIn(model, 'busy')
    const nq = b.namespaceIn(model, 'quiet')
    assert.equal(new Set([nb, nq, b.namespace(model)]).size, 3, 'one model, three namespaces')
    throwsResult(() => a.namespaceIn(model, 'nobody'), 'NO_TENANT')
    const body = Buffer.alloc(10_000, 't')
    for (let i = 0; i < 20; i++) assert.deepEqual((i % 2 ? a : b).put(nb, [key(1000 + i)], [body]), ['OK'])
    assert.deepEqual(b.put(nq, [key(1000)], [Buffer.alloc(10_000, 'q')]), ['OK'])
    const byName = Object.fromEntries(a.tenants().map((t) => [t.name, t]))
    assert.deepEqual(Object.keys(byName), ['default', 'busy', 'quiet'])
    const busy = byName.busy
    assert.equal(busy.quota, 64 * 1024)
    assert.equal(busy.priority, 2)
    assert.ok(busy.bytes <= 64 * 1024 && busy.bytes === busy.blocks * 10_000 && busy.evictions > 0, JSON.stringify(busy))
    assert.equal(byName.quiet.bytes, 10_000)
    assert.equal(byName.quiet.dropping, false)
    b.tenantSet('busy', { quota: 20_000 })
    assert.deepEqual(a.put(nb, [key(2000)], [body]), ['OK'])
    assert.ok(a.tenants().find((t) => t.name === 'busy').bytes <= 20_000)
    const dropped = a.tenantDrop('busy')
    assert.ok(dropped.blocks >= 1 && dropped.bytes === dropped.blocks * 10_000)
    assert.deepEqual(b.tenants().map((t) => t.name), ['default', 'quiet'])
    throwsResult(() => a.put(nb, [key(3000)], [body]), 'NO_TENANT')
    assert.equal(b.exists(nq, key(1000)), true)
    assert.deepEqual(a.check(), [])
    // A lifetime: once it has passed, the block is missing to every reader
    // and a put replaces it (only what must hold after the wait is checked).
    a.tenantAdd('brief', { ttlMs: 30, scrub: true })
    const ns = a.namespaceIn(model, 'brief')
    assert.deepEqual(a.put(ns, [key(5000)], [Buffer.alloc(100, 'b')]), ['OK'])
    const until = Date.now() + 60
    while (Date.now() < until) Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 10)
    assert.equal(b.exists(ns, key(5000)), false)
    assert.equal(b.lookup(ns, [key(5000)]), 0)
    assert.deepEqual(b.put(ns, [key(5000)], [Buffer.alloc(100, 'c')]), ['OK'])
    const brief = a.tenants().find((t) => t.name === 'brief')
    assert.ok(brief.ttlMs === 30 && brief.scrub && brief.expired === 1 && brief.blocks === 1, JSON.stringify(brief))
    throwsResult(() => a.tenantSet('brief', { ttlMs: 2 ** 40 + 1 }), 'INVALID_ARGUMENT')
  } finally {
    a.detach()
    b.detach()
    region.close()
  }
})

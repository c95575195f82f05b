'use strict'
// Shared by the tests: scratch regions, a private host-local directory, and
// the expected-error check.
const assert = require('node:assert/strict')
const fs = require('node:fs')
const os = require('node:os')
const path = require('node:path')
const crypto = require('node:crypto')
const cxlkv = require('..')

/** What the process removes when it exits. */
const scratch = []
process.on('exit', () => {
  for (const p of scratch) fs.rmSync(p, { recursive: true, force: true })
})

/** A unique path for a region file in /dev/shm, removed at exit. */
function scratchPath(tag) {
  const p = `/dev/shm/cxlkv-node-${tag}-${process.pid}-${crypto.randomBytes(4).toString('hex')}`
  scratch.push(p)
  return p
}

/** A private directory for the host-local lock files, removed at exit. */
function localDir() {
  const d = fs.mkdtempSync(path.join(os.tmpdir(), 'cxlkv-node-'))
  scratch.push(d)
  return d
}

/** A small formatted region file. */
function smallRegion(tag, size = 32 << 20) {
  const file = scratchPath(tag)
  const region = cxlkv.Region.create(file, size)
  region.format({ chunkShift: 16, maxNodes: 8, nStripes: 4, entriesPerStripe: 256, appLocks: 2 })
  return { file, region, local: localDir() }
}

/** Asserts `fn` throws `cls` with result code `code`. */
function throwsCode(fn, cls, code) {
  assert.throws(fn, (e) => {
    assert.ok(e instanceof cls, `${e} is not a ${cls.name}`)
    assert.equal(e.code, code, e.message)
    assert.equal(e.result, cxlkv.codes()[code])
    return true
  })
}

/** Asserts the promise rejects with `cls` and result code `code`. */
async function rejectsCode(promise, cls, code) {
  await assert.rejects(promise, (e) => {
    assert.ok(e instanceof cls, `${e} is not a ${cls.name}`)
    assert.equal(e.code, code, e.message)
    assert.equal(e.result, cxlkv.codes()[code])
    return true
  })
}

/** Bytes of block `i`: a pattern any process recomputes. */
function pattern(i, len) {
  const b = Buffer.allocUnsafe(len)
  let x = (i * 2654435761 + 12345) >>> 0
  for (let j = 0; j < len; j++) {
    x = (Math.imul(x, 1103515245) + 12345) >>> 0
    b[j] = x >>> 24
  }
  return b
}

/** A 16-byte key from a small integer. */
function key(i) {
  const b = Buffer.alloc(16)
  b.writeUInt32LE(i, 0)
  b.write('node-key', 8)
  return b
}

module.exports = { cxlkv, scratchPath, localDir, smallRegion, throwsCode, rejectsCode, pattern, key }

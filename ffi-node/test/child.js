'use strict'
// A second Node process for processes.test.js, driven over the fork IPC
// channel. argv: region file, host-local directory, role.
const { cxlkv, pattern, key } = require('./helpers')

const [file, local, role] = process.argv.slice(2)
const NS = 11

async function reader(node) {
  process.send({ ready: node.id })
  const { n, size } = await new Promise((r) => process.once('message', r))
  const keys = Array.from({ length: n }, (_, i) => key(i))
  let polls = 0
  while (node.lookup(NS, keys) < n) {
    polls++
    await new Promise((r) => setTimeout(r, 1))
  }
  const p = node.acquire(NS, keys)
  let bad = 0
  p.views().forEach((v, i) => {
    if (v === null || !Buffer.from(v).equals(pattern(i, size))) bad++
  })
  p.release()
  // And once more through a copying get off the event loop.
  const out = keys.map(() => Buffer.alloc(size))
  const got = await node.getAsync(NS, keys, out)
  got.forEach((g, i) => {
    if (g.result !== 'OK' || !out[i].equals(pattern(i, size))) bad++
  })
  return { verified: n, bad, polls }
}

async function server(node) {
  process.send({ ready: node.id })
  for (;;) {
    const req = await node.recvAsync(30_000)
    if (req.kind === 99) return { served: true }
    node.reply(req, req.status + 1, [req.stamp, ...req.keys])
  }
}

async function main() {
  const region = cxlkv.Region.open(file)
  const node = await region.attachAsync({ localDir: local })
  const result = role === 'reader' ? await reader(node) : await server(node)
  node.detach()
  process.send({ done: result })
  process.disconnect()
}

main().catch((e) => {
  process.send({ error: `${e.code ?? ''} ${e.stack}` })
  process.exitCode = 1
})

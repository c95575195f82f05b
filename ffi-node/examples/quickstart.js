// cxlkv from Node: a region, a node, blocks written in place, found by
// prefix, read zero-copy, and a copying put and get.
//
//   (cd ffi-node && npm ci && npm run build)      # the addon
//   npm install /path/to/cxlkv/ffi-node           # in your app
//   node quickstart.js
const fs = require('node:fs')
const cxlkv = require('cxlkv') // typings in index.d.ts

async function main () {
  const path = `/dev/shm/cxlkv-quickstart-${process.pid}`
  const region = cxlkv.Region.create(path, 64 << 20) // or Region.open('/dev/dax0.0')
  region.format() // once per region, before any node attaches
  const node = await region.attachAsync() // heartbeat + lock manager
  try {
    const ns = node.namespace({ model: 'llama-3-8b', dtype: 1, tpRank: 0, tpSize: 2, blockTokens: 16 })
    const tokens = Array.from({ length: 48 }, (_, i) => 1000 + i) // 3 blocks of 16
    const keys = cxlkv.chainKeys(tokens, 16) // the same keys as C and Python
    const r = await node.reserveAsync(ns, keys, 4096, 16) // writable views
    for (let i = 0; i < keys.length; i++) new Uint8Array(r.view(i)).fill(i + 1)
    await r.publishAsync() // visible to every node at once (or r.abort())
    const hit = node.lookup(ns, keys) // longest cached prefix
    const pinned = node.acquire(ns, keys.slice(0, hit)) // zero-copy views
    const kv = new Uint16Array(pinned.view(0)) // fp16 bits, no copy
    console.log(`cached prefix: ${hit} of ${keys.length} blocks; block 0 holds ${kv.length} fp16 values`)
    pinned.release() // detaches every view: they read as empty after
    const key = cxlkv.chainKeys([...tokens, ...Array(16).keys()], 16)[3]
    console.log(node.put(ns, [key], [[Buffer.alloc(512, 'K'), Buffer.alloc(512, 'V')]])) // ['OK']
    const out = Buffer.alloc(1024)
    console.log(await node.getAsync(ns, [key], [out])) // [{ result: 'OK', length: 1024 }]
    if (!out.equals(Buffer.concat([Buffer.alloc(512, 'K'), Buffer.alloc(512, 'V')]))) throw new Error('wrong bytes')
  } finally {
    node.detach()
    region.close()
    fs.unlinkSync(path)
  }
}

main().catch((e) => {
  console.error(e)
  process.exit(1)
})

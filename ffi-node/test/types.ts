// Compiled (not run) by `npm run typecheck`: the generated typings describe
// the calls as a TypeScript control plane writes them, strictly.
import {
  chainKeys,
  codes,
  namespaceDigest,
  Region,
  type GetResult,
  type Key,
  type Message,
  type Node,
  type Pinned,
  type Presence,
  type Stats,
} from '..'

async function usage(path: string): Promise<void> {
  const region: Region = Region.open(path)
  const node: Node = await region.attachAsync({ localDir: '/dev/shm', leaseMs: 2000 })
  const digest: Buffer = namespaceDigest({ model: 'llama', tpRank: 0, tpSize: 2, blockTokens: 16, extra: 5n, salt: Buffer.from('s') })
  const ns: number = node.namespace({ model: 'llama', tpSize: 2, salt: digest.toString('hex') })
  const keys: Buffer[] = chainKeys(Uint32Array.from([1, 2, 3, 4]), 2)
  const mixed: Key[] = [keys[0], 7n]
  const hit: number = node.lookup(ns, keys)
  const p: Presence = node.presence(ns, mixed)
  const pinned: Pinned = node.acquire(ns, keys.slice(0, hit))
  const view: ArrayBuffer | null = pinned.view(0)
  if (view) new Uint8Array(view).at(0)
  pinned.release()
  const r = await node.reserveAsync(ns, keys.slice(hit), 4096, 16)
  new Uint8Array(r.view(0)).fill(1)
  const results: string[] = await r.publishAsync()
  const got: GetResult[] = await node.getAsync(ns, keys, keys.map(() => [Buffer.alloc(2048), new Uint8Array(2048)]))
  const stored: string[] = node.put(ns, [3n], [new Float32Array(8)])
  const stats: Stats = node.stats()
  const alive: bigint = stats.aliveMask
  const m: Message = await node.callAsync(1, { kind: 3, keys: [keys[0]], stamp: 1n }, 1000)
  node.reply(m, 0, keys)
  const table: Record<string, number> = codes()
  console.log(p.prefix, results, got[0].length, stored, alive, table.OK, m.requestId)
  node.detach()
  region.close()
}

void usage

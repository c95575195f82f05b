'use strict'
// One-call overhead of Node's `get` and `acquire` against the C API's, as
// users make the calls: this process fills a working set of blocks in a
// region; then a second Node process and a C program (ffi-node/bench/reader.c,
// built against libcxlkv) each read every block once right after attaching
// ("first"), once more ("again"), through a copying get of one key into a
// preallocated buffer, then pin each block (acquire, view, release), in a
// random order, timing each call. Prints numbers; no pass or fail on time.
//
//   node bench/bench.js [--quick] [--mode clflush|coherent] [--ws-mib N] [--sizes 16K,2M] [--rounds 3]
const { execFileSync, fork } = require('node:child_process')
const fs = require('node:fs')
const os = require('node:os')
const path = require('node:path')
const cxlkv = require('..')

const NS = 13
const FLUSH = { default: 0, coherent: 1, clflush: 2, clflushopt: 3, clwb: 4 }

/** Keys `0 .. n`, as 16-byte Buffers over one allocation outside V8's heap
 * (as `chainKeys` returns them; a `Buffer.alloc(16)` lives in V8's heap
 * and is moved out of it on its first native use, about 0.5 us). */
function keys(n) {
  const all = Buffer.allocUnsafeSlow(16 * n)
  return Array.from({ length: n }, (_, i) => {
    const b = all.subarray(16 * i, 16 * i + 16)
    b.writeUInt32LE(i, 0)
    b.writeUInt32LE(0, 4)
    b.write('bench-nd', 8)
    return b
  })
}

function percentiles(lat) {
  lat.sort((a, b) => a - b)
  return [lat[Math.floor(lat.length / 2)], lat[Math.floor((lat.length * 99) / 100)]]
}

/** The Node reader (in a child process): the same passes as reader.c. */
async function nodeReader([file, local, mode, size, n]) {
  size = Number(size)
  n = Number(n)
  const region = cxlkv.Region.open(file)
  const node = region.attach({ localDir: local, flushMode: mode })
  const order = Array.from({ length: n }, (_, i) => i)
  const shuffle = () => {
    for (let i = n; i > 1; i--) {
      const j = Math.floor(Math.random() * i)
      ;[order[i - 1], order[j]] = [order[j], order[i - 1]]
    }
  }
  const buf = [Buffer.alloc(size)]
  const lists = keys(n).map((k) => [k])
  const lat = new Array(n)
  const out = {}
  for (const pass of ['get_first', 'get_again']) {
    shuffle()
    for (let i = 0; i < n; i++) {
      const k = lists[order[i]]
      const t = process.hrtime.bigint()
      const [g] = node.get(NS, k, buf)
      lat[i] = Number(process.hrtime.bigint() - t)
      if (g.result !== 'OK' || g.length !== size || buf[0][0] !== (order[i] & 0xff)) throw new Error(`get ${order[i]}: ${g.result}`)
    }
    out[pass] = percentiles(lat)
  }
  shuffle()
  for (let i = 0; i < n; i++) {
    const k = lists[order[i]]
    const t = process.hrtime.bigint()
    const p = node.acquire(NS, k)
    const v = p.view(0)
    p.release()
    lat[i] = Number(process.hrtime.bigint() - t)
    if (v === null) throw new Error(`acquire ${order[i]}: not found`)
  }
  out.acquire = percentiles(lat)
  node.detach()
  process.send(out)
}

/** libcxlkv.a and the reader built against it (cargo, then cc). */
function buildC(root) {
  execFileSync('cargo', ['build', '--release', '--locked', '-q', '-p', 'cxlkv-ffi-c'], { cwd: root, stdio: 'inherit' })
  const meta = JSON.parse(execFileSync('cargo', ['metadata', '--format-version', '1', '--no-deps'], { cwd: root, encoding: 'utf8', maxBuffer: 1 << 26 }))
  const lib = path.join(meta.target_directory, 'release', 'libcxlkv.a')
  const exe = path.join(os.tmpdir(), `cxlkv-node-bench-reader-${process.pid}`)
  const cc = process.env.CC || 'cc'
  execFileSync(cc, ['-O2', '-std=c11', '-I', path.join(root, 'ffi-c/include'), path.join(__dirname, 'reader.c'), lib, '-lpthread', '-ldl', '-lm', '-o', exe], { stdio: 'inherit' })
  return exe
}

/** Per measure, the median over runs of each percentile. */
function medians(runs) {
  const out = {}
  for (const name of Object.keys(runs[0])) {
    out[name] = [0, 1].map((j) => {
      const v = runs.map((r) => r[name][j]).sort((a, b) => a - b)
      return v[Math.floor(v.length / 2)]
    })
  }
  return out
}

function parseSize(s) {
  const m = /^(\d+)([KM]?)$/i.exec(s)
  if (!m) throw new Error(`bad size ${s}`)
  return Number(m[1]) * { '': 1, K: 1024, M: 1 << 20 }[m[2].toUpperCase()]
}

async function main() {
  const args = process.argv.slice(2)
  const opt = (name, dflt) => {
    const i = args.indexOf(name)
    return i >= 0 ? args[i + 1] : dflt
  }
  const quick = args.includes('--quick')
  const mode = opt('--mode', 'clflush')
  const wsMib = Number(opt('--ws-mib', quick ? 32 : 1920))
  const sizes = opt('--sizes', '16K,2M').split(',').map(parseSize)
  const rounds = Number(opt('--rounds', quick ? 1 : 3))
  const root = path.resolve(__dirname, '../..')
  const reader = buildC(root)
  const local = fs.mkdtempSync(path.join(os.tmpdir(), 'cxlkv-node-bench-'))
  const rows = []
  try {
    for (const size of sizes) {
      const n = Math.max(64, Math.floor((wsMib << 20) / size))
      const file = `/dev/shm/cxlkv-node-bench-${process.pid}`
      const region = cxlkv.Region.create(file, n * size * 1.25 + (64 << 20), { overwrite: true })
      const stripes = 64
      region.format({ flushMode: mode, nStripes: stripes, entriesPerStripe: Math.max(256, 2 ** Math.ceil(Math.log2((n * 2) / stripes))) })
      const w = region.attach({ localDir: local, flushMode: mode })
      const all = keys(n)
      for (let i = 0; i < n; i += 64) {
        const batch = all.slice(i, i + 64)
        const bodies = batch.map((_, j) => Buffer.alloc(size, (i + j) & 0xff))
        const r = await w.putAsync(NS, batch, bodies)
        if (!r.every((x) => x === 'OK')) throw new Error(`put: ${r}`)
      }
      // Each reader leaves the caches as the next one finds them, and on a
      // shared VM runs drift: a first C run (not reported), then Node and C
      // in turn `rounds` times; each figure is the median over the rounds.
      const runC = () => JSON.parse(execFileSync(reader, [file, local, String(FLUSH[mode]), String(size), String(n)], { encoding: 'utf8', timeout: 600_000 }))
      const runNode = async () => {
        const child = fork(__filename, ['--reader', file, local, mode, String(size), String(n)])
        const got = await new Promise((resolve, reject) => {
          child.once('message', resolve)
          child.once('exit', (code) => code && reject(new Error(`node reader exited ${code}`)))
        })
        await new Promise((r) => child.once('exit', r))
        return got
      }
      runC()
      const nodeRuns = []
      const cRuns = []
      for (let round = 0; round < rounds; round++) {
        nodeRuns.push(await runNode())
        cRuns.push(runC())
      }
      const fromNode = medians(nodeRuns)
      const fromC = medians(cRuns)
      rows.push({ size, n, fromNode, fromC })
      w.detach()
      region.close()
      fs.rmSync(file, { force: true })
    }
  } finally {
    fs.rmSync(local, { recursive: true, force: true })
    fs.rmSync(reader, { force: true })
  }
  const us = (ns) => (ns / 1000).toFixed(1).padStart(9)
  console.log(`Node vs C, one key a call, other process than the writer, random keys over ${wsMib} MiB, mode ${mode}, median of ${rounds} runs each`)
  console.log('   block  call                Node p50    C p50  Node p99    C p99  Node-C p50 (us)')
  for (const { size, fromNode, fromC } of rows) {
    const label = size >= 1 << 20 ? `${size >> 20} MiB` : `${size >> 10} KiB`
    for (const [name, what] of [['get_first', 'get (first pass)'], ['get_again', 'get (again)'], ['acquire', 'acquire+view+release']]) {
      const [np50, np99] = fromNode[name]
      const [cp50, cp99] = fromC[name]
      console.log(`${label.padStart(8)}  ${what.padEnd(20)}${us(np50)}${us(cp50)}${us(np99)}${us(cp99)}${us(np50 - cp50)}`)
    }
  }
}

if (process.argv[2] === '--reader') {
  nodeReader(process.argv.slice(3)).catch((e) => {
    console.error(e)
    process.exit(1)
  })
} else {
  main().catch((e) => {
    console.error(e)
    process.exit(1)
  })
}

/* The typings of the `cxlkv` addon, written by `napi build` from ffi-node/src
   (this header: ffi-node/header.d.ts). Do not edit: regenerate. */

/** A key: its 16 bytes (low half first) in a Buffer or Uint8Array, or a bigint below 2**128. */
export type Key = Uint8Array | bigint
/** Keys: an array of keys, or one buffer holding 16-byte keys back to back. */
export type Keys = Key[] | Uint8Array
/** Bytes to copy from or into: a Buffer, any typed array, a DataView or an ArrayBuffer. */
export type Bytes = ArrayBufferView | ArrayBuffer

/**
 * Which binding artifact the generated loader actually loaded: `'native'` for
 * a native addon, otherwise the `platformArchABI` of the WASI flavor. Every
 * flavor napi-rs can build is listed, because `NAPI_RS_NATIVE_LIBRARY_PATH`
 * can point the loader at a WASI artifact this package does not build itself.
 */
export declare const __napiBindingTarget: 'native' | 'wasm32-wasi' | 'wasm32-wasip1'

/**
 * An application lock held by this thread (`node.lock(n)`): release it.
 * Held until released (by the thread that took it) or the node dies.
 */
export declare class AppLock {
  /** The lock's number. */
  get number(): number
  /** True once released. */
  get released(): boolean
  /**
   * Releases the lock (publish what it guards first: `writeRange` does).
   * Only the thread that took it may; a second release does nothing.
   * `REVOKED` when the grant was over already.
   */
  release(): void
}

/**
 * A cursor over the region's change log (`node.changeCursor()`). It does
 * not keep its node attached: once the node detached, a poll throws
 * `INVALID_HANDLE`.
 */
export declare class ChangeCursor {
  /**
   * The changes since the last poll of `namespaces` (every namespace
   * when left out), and the stripes that lost changes meanwhile.
   */
  poll(namespaces?: number[]): Changes
}

/** An attached node: every cache operation. */
export declare class Node {
  /** This node's id (its slot in the node table). */
  get id(): number
  /** True once detached. */
  get closed(): boolean
  /**
   * The id of namespace `fields` in this region, registered on first
   * use: every node passing equal fields gets the same id, fields that
   * differ in anything never share one (the region keeps each
   * namespace's 128-bit digest). Each namespace takes one record of the
   * root table (`ROOTS_FULL` when none is left). A number is an id as is
   * (below 2**31: one the application picks).
   */
  namespace(fields: NamespaceFields | number): number
  /** Length of the longest prefix of `keys` whose blocks are stored. */
  lookup(ns: number, keys: Keys): number
  /** The longest stored prefix of `keys` and whether each key is stored. */
  presence(ns: number, keys: Keys): Presence
  /** Whether `key` is stored. */
  exists(ns: number, key: Key): boolean
  /**
   * Pins the stored blocks of `keys` for zero-copy reads: a `Pinned`
   * whose `view(i)` is key `i`'s payload, or `null` when it is not
   * stored (any other failure of a key throws, and nothing stays
   * pinned). Release it when done.
   */
  acquire(ns: number, keys: Keys): Pinned
  /** `acquire` off the event loop. */
  acquireAsync(ns: number, keys: Keys): Promise<Pinned>
  /**
   * Reserves writable blocks: `sizes` is one size for every key or one
   * per key. When any key cannot be reserved none is, and the error names
   * the key (`EXISTS` when it is stored already). Fill the views, then
   * `publish()` (or `abort()`).
   */
  reserve(ns: number, keys: Keys, sizes: number | number[], tokens?: number): Reservation
  /** `reserve` off the event loop. */
  reserveAsync(ns: number, keys: Keys, sizes: number | number[], tokens?: number): Promise<Reservation>
  /**
   * Stores blocks by copying: `buffers[i]` (a buffer, or an array of
   * buffers stored one after the other) becomes key `i`'s payload.
   * Returns a result name per key: `"OK"`, `"EXISTS"` (stored already;
   * nothing written), or why it failed.
   */
  put(ns: number, keys: Keys, buffers: Array<Bytes | Bytes[]>, tokens?: number): Array<string>
  /** `put` off the event loop. Leave the buffers alone until it settled. */
  putAsync(ns: number, keys: Keys, buffers: Array<Bytes | Bytes[]>, tokens?: number): Promise<string[]>
  /**
   * Copies stored blocks into existing buffers: `buffers[i]` (a buffer, or
   * an array filled in order) receives key `i`'s payload. Returns a
   * `GetResult` per key.
   */
  get(ns: number, keys: Keys, buffers: Array<Bytes | Bytes[]>): Array<GetResult>
  /** `get` off the event loop. Leave the buffers alone until it settled. */
  getAsync(ns: number, keys: Keys, buffers: Array<Bytes | Bytes[]>): Promise<GetResult[]>
  /**
   * Removes the stored blocks of `keys`; per key, whether it was removed
   * (false: not stored, or pinned: a pinned block stays until released).
   * It walks every stripe (an eviction that picks these keys): for the
   * occasional delete, not the data path.
   */
  remove(ns: number, keys: Keys): Array<boolean>
  /**
   * Starts this host's SSD tier on this node (which it then keeps to
   * itself: its inbox serves the rack's requests): slot files of
   * `capacity` bytes in each of `dirs` (one per drive, on a real disk
   * file system), holding blocks up to `slotBytes`; cold blocks are
   * copied out, `batch` at a time, once the region is `highWater` full.
   */
  startTier(dirs: string[], options?: TierOptions): Tier
  /**
   * A cursor over the region's change log from now on: its `poll`
   * returns the stores and removals any node makes afterwards.
   */
  changeCursor(): ChangeCursor
  /**
   * Removes every stored block of `namespaces` that nothing pins (other
   * namespaces' blocks stay): an engine's clear. It walks every stripe.
   */
  clearNamespaces(namespaces: number[]): Evicted
  /**
   * Evicts least-recently-used unpinned blocks until `nbytes` of payload
   * are freed or none is left.
   */
  evict(nbytes: number): Evicted
  /** `evict` off the event loop. */
  evictAsync(nbytes: number): Promise<Evicted>
  /** Counters of this node and of every node, liveness and occupancy. */
  stats(): Stats
  /** Recovers the region after nodes died (normally automatic). */
  recover(): Recovered
  /** `recover` off the event loop. */
  recoverAsync(): Promise<Recovered>
  /**
   * An operator's word that node `n`, declared dead, will never store
   * again (its host is powered off, or was rebooted since): the next
   * recovery frees the reservations and raw blocks kept quarantined for
   * it. Never say it of a host that may only be stopped. True when said
   * now; false when `n` is not dead or is quiet already.
   */
  declareQuiet(n: number): boolean
  /**
   * Every invariant of the region, checked: the findings (empty when
   * clean). Exact on a quiescent region; on a live one, changes in
   * flight can show up as findings.
   */
  check(): Array<string>
  /** `check` off the event loop. */
  checkAsync(): Promise<string[]>
  /**
   * Sends `message` to node `to`'s inbox, waiting (up to the lock
   * timeout) while it is full. `BAD_NODE` when `to` is not attached.
   */
  send(to: number, message: Outgoing): void
  /** `send` off the event loop (waiting while the inbox is full). */
  sendAsync(to: number, message: Outgoing): Promise<void>
  /** The next message of this node's inbox, or `null` when none is there. */
  tryRecv(): Message | null
  /**
   * Waits up to `timeoutMs` for the next message; `TIMEOUT` when none
   * came. Blocks the event loop: prefer `recvAsync`.
   */
  recv(timeoutMs: number): Message
  /**
   * `recv` off the event loop: a thread of its own waits (never one of
   * libuv's pool, and a process exit does not wait for it).
   */
  recvAsync(timeoutMs: number): Promise<Message>
  /**
   * A request/response round trip: sends `message` to node `to` and waits
   * up to `timeoutMs` for the answer its owner gives with `reply`.
   * Messages arriving meanwhile stay queued for `recv`.
   */
  call(to: number, message: Outgoing, timeoutMs: number): Message
  /**
   * `call` off the event loop (a thread of its own waits for the answer,
   * as for `recvAsync`).
   */
  callAsync(to: number, message: Outgoing, timeoutMs: number): Promise<Message>
  /**
   * Answers `request` (a message `recv` returned) with `status` and
   * `keys`.
   */
  reply(request: Message, status: number, keys?: Keys): void
  /**
   * Detaches: drops this node's pins and reservations and frees its slot.
   * `BUSY` while a `Pinned` or `Reservation` of it is unreleased (or an
   * async call is running). Detaching twice does nothing.
   */
  detach(): void
  /**
   * Allocates `size` bytes of region payload (64-byte aligned); returns
   * its offset. It stays allocated until `free`, across this node's death
   * too once a named root names it.
   */
  alloc(size: number): number
  /** Frees an allocation made by `alloc` (by any node). */
  free(offset: number): void
  /**
   * Names an allocation: `rootGet(name)` finds it from any process.
   * `EXISTS` if the name is taken.
   */
  rootPut(name: string, value: { offset: number, size: number, tag?: number }): void
  /** What root `name` names; `NOT_FOUND` if absent. */
  rootGet(name: string): RootValue
  /** Removes root `name` (what it names stays allocated); returns it. */
  rootDestroy(name: string): RootValue
  /** Removes root `name` and frees what it names, in one step; returns it. */
  rootFree(name: string): RootValue
  /**
   * `length` bytes of the payload area at `offset`, read fresh.
   * `OUT_OF_BOUNDS` outside the payload area.
   */
  readRange(offset: number, length: number): Buffer
  /**
   * Copies `data` into the payload area at `offset` and publishes it to
   * every host.
   */
  writeRange(offset: number, data: Bytes): void
  /** Publishes `length` bytes at `offset` written by other means. */
  flushRange(offset: number, length: number): void
  /** Drops this host's cached copies of `length` bytes at `offset`. */
  invalidateRange(offset: number, length: number): void
  /** Allocates an application lock; returns its number. */
  lockAlloc(): number
  /** Frees application lock `number` (once no node holds or will take it). */
  lockFree(number: number): void
  /**
   * Takes application lock `number`, waiting up to the node's lock
   * timeout (`TIMEOUT`); returns it held. Not recursive (`BUSY` when this
   * thread holds it). Taking it fences.
   */
  lock(number: number): AppLock
  /**
   * Adds tenant `name` (1 to 20 bytes) with a hard `quota` and a
   * guaranteed `share` in payload bytes, a `priority` and a lifetime
   * for its blocks, `ttlMs` (each left out: none). `EXISTS` when a
   * tenant of that name lives, `TENANTS_FULL` when every slot (the
   * `maxTenants` capacity) is taken.
   */
  tenantAdd(name: string, limits?: { quota?: number, share?: number, priority?: number, ttlMs?: number, scrub?: boolean }): void
  /**
   * Changes a live tenant's limits (every node follows at once; a new
   * lifetime applies to blocks stored from then on).
   */
  tenantSet(name: string, limits?: { quota?: number, share?: number, priority?: number, ttlMs?: number, scrub?: boolean }): void
  /** Every tenant, the default one first, with its limits and usage. */
  tenants(): Array<Tenant>
  /**
   * Drops tenant `name`: its blocks are removed and its slot freed.
   * `BUSY` while blocks of it are pinned or being written (it takes no
   * new block meanwhile: call again once they are released).
   */
  tenantDrop(name: string): Evicted
  /**
   * The id of namespace `fields` of tenant `tenant`, registered on first
   * use: the same fields in another tenant are another namespace (tenants
   * never share a block), and its blocks count to the tenant's usage and
   * quota. `NO_TENANT` when there is no such tenant.
   */
  namespaceIn(fields: NamespaceFields, tenant: string): number
}

/**
 * Blocks pinned by `Node.acquire`: `view(i)` is an `ArrayBuffer` over key
 * `i`'s payload in the region (no copy), `null` when the key is not stored.
 * Pinned blocks are never evicted or changed. Do not write to a view: it is
 * the stored block every reader sees. `release()` drops the pins and
 * detaches every view (their length becomes 0).
 */
export declare class Pinned {
  /** How many keys were asked for. */
  get length(): number
  /** How many of the keys were found and pinned. */
  get found(): number
  /** The key of each pinned block (`null` where not found). */
  get keys(): Array<Buffer | undefined | null>
  /** The region offset of each block's payload (`null` where not found). */
  get offsets(): Array<number | undefined | null>
  /** True once released. */
  get released(): boolean
  /** The zero-copy view of block `i` (`null` when key `i` is not stored). */
  view(i: number): ArrayBuffer | null
  /** Every block's view, in key order. */
  views(): Array<ArrayBuffer | null>
  /**
   * Drops the pins after detaching every view. `STALE_HANDLE` the second
   * time.
   */
  release(): void
}

/**
 * A mapped region: a file, /dev/shm, hugetlbfs, a device-DAX device, or an
 * anonymous memfd. Closing it leaves nodes attached through it working.
 */
export declare class Region {
  /**
   * Creates a region file of `size` bytes at `path` (owner-only), not yet
   * formatted. An existing file is refused unless `overwrite`. A
   * device-DAX path (/dev/daxX.Y) is opened instead.
   */
  static create(path: string, size: number, options?: CreateOptions): Region
  /**
   * Maps the existing region at `path` (file, /dev/shm, hugetlbfs or
   * /dev/daxX.Y).
   */
  static open(path: string): Region
  /**
   * An anonymous shared region of `size` bytes (on 2 MiB huge pages with
   * `hugetlb`), private to this process (Node cannot fork).
   */
  static memfd(size: number, options?: MemfdOptions): Region
  /**
   * Formats the region, erasing it. `BUSY` while a node of this process
   * is attached to it.
   */
  format(options?: FormatOptions): void
  /** Attaches a node (starting its heartbeat and lock-manager thread). */
  attach(options?: AttachOptions): Node
  /** `attach` off the event loop. */
  attachAsync(options?: AttachOptions): Promise<Node>
  /** The mapped size in bytes. */
  get size(): number
  /** True once closed. */
  get closed(): boolean
  /** Closes this handle (nodes attached through it keep the mapping). */
  close(): void
}

/**
 * Blocks reserved by `Node.reserve`: `view(i)` is a writable `ArrayBuffer`
 * over key `i`'s payload in the region. `publish()` makes every block
 * visible to every node at once; `abort()` frees them. Both detach the
 * views.
 */
export declare class Reservation {
  /** How many blocks are reserved. */
  get length(): number
  /** The key of each block. */
  get keys(): Array<Buffer | undefined | null>
  /** The region offset of each block's payload. */
  get offsets(): Array<number | undefined | null>
  /** True once published or aborted. */
  get done(): boolean
  /**
   * The writable zero-copy view of block `i`. `UNSUPPORTED` where the
   * runtime refuses external buffers.
   */
  view(i: number): ArrayBuffer
  /** Every block's view, in key order. */
  views(): Array<ArrayBuffer>
  /**
   * Detaches the views, flushes every payload and publishes the blocks;
   * returns a result name per block (`"OK"`, or why it failed).
   */
  publish(): Array<string>
  /**
   * `publish` off the event loop: the views are detached at once, the
   * blocks published on the libuv pool.
   */
  publishAsync(): Promise<string[]>
  /**
   * Detaches the views and abandons the blocks: their space is freed, the
   * keys can be reserved again.
   */
  abort(): void
}

/**
 * A running SSD tier: copies cold blocks to slot files on its drives and
 * puts them back when a node asks. Stop it before detaching its node.
 */
export declare class Tier {
  /** The tier's counters. */
  stats(): TierCounters
  /**
   * Copies every block of the region the tier does not hold yet (up to
   * its capacity); returns how many. Blocks the caller while it runs.
   */
  spillAll(): number
  /**
   * Stops the tier (its blocks stop being offered to the rack). Stopping
   * twice does nothing.
   */
  stop(): void
}

/** Options of `Region.attach`. */
export interface AttachOptions {
  /** Node id to claim (default: the first free one). */
  nodeId?: number
  /** Cache maintenance (default: this machine's). */
  flushMode?: string
  /** A heartbeat silent this long means dead (default 2000). */
  leaseMs?: number
  /** Give up waiting for a lock after this long (default 60000). */
  lockTimeoutMs?: number
  /** Wait after claiming the manager role before granting (default 50). */
  settleMs?: number
  /** Recover automatically when a node is declared dead (default true). */
  autoRecover?: boolean
  /** Directory of the host-local lock file (default /dev/shm). */
  localDir?: string
}

/**
 * Core's table of region capacities: each one's default by its
 * `Region.format` option name (camelCase of the C and Python name).
 */
export declare function capacityDefaults(): Record<string, number>

/**
 * Chained 128-bit block keys of `tokens`: key `i` covers tokens
 * `0 .. (i+1)*blockTokens`, derived from key `i-1` (or `parent`). A partial
 * last block gets no key. Equal prefixes give equal chains in every
 * process and language (C, Python, Node).
 */
export declare function chainKeys(tokens: Uint32Array | number[], blockTokens: number, parent?: Key): Array<Buffer>

/** A change of the region's index. */
export interface Change {
  /**
   * True: the block was stored (published); false: removed (evicted or
   * removed).
   */
  stored: boolean
  /** Its namespace. */
  ns: number
  /** Its key (16 bytes). */
  key: Buffer
  /** Its payload bytes. */
  len: number
  /** Tokens it covers. */
  tokens: number
  /** The node that made the change. */
  node: number
}

/** What a poll found. */
export interface Changes {
  /** The changes since the last poll, in each stripe's order. */
  changes: Array<Change>
  /**
   * Stripes that lost changes since the last poll (the cursor fell a
   * whole log behind, or a recovery rebuilt the stripe): check what you
   * know against the region.
   */
  gaps: Array<number>
}

/**
 * Every result code by name (`OK`: 1000, `EXISTS`: ...), as in C (where
 * each is `CXLKV_RESULT_<NAME>`); an error's `code` is one of the names,
 * its `result` the number.
 */
export declare function codes(): Record<string, number>

/** Options of `Region.create`. */
export interface CreateOptions {
  /**
   * Replace an existing file (default false: an existing file is refused;
   * a file another user owns is never replaced).
   */
  overwrite?: boolean
  /**
   * The file's permission bits, exactly (default 0o600, its owner
   * alone; 0o660 lets its group map it too). The owner must read and
   * write. Every process that maps a region can read all of it.
   */
  mode?: number
}

/** What `evict` freed. */
export interface Evicted {
  /** Blocks evicted. */
  blocks: number
  /** Their payload bytes. */
  bytes: number
}

/**
 * Options of `Region.format`: capacities left out keep their defaults.
 * The capacities are core's table (`Capacities::FIELDS`) in camelCase,
 * which the options are read by; a test holds this declaration to it.
 */
export interface FormatOptions {
  /** `"auto"` (the default), `"coherent"`, `"clflush"`, `"clflushopt"`, `"clwb"`, ... */
  flushMode?: string
  /** Most nodes attached at once (at most 64). */
  maxNodes?: number
  /** Index stripes (each with its own lock). */
  nStripes?: number
  /** Entries per stripe. */
  entriesPerStripe?: number
  /** Named roots. */
  nRoots?: number
  /** Pin slots per node. */
  pinSlots?: number
  /** log2 of the allocator's chunk size. */
  chunkShift?: number
  /** Slots of each sender's ring in each node's inbox (a power of two). */
  inboxSlots?: number
  /** Application locks. */
  appLocks?: number
  /** Tier directories (hosts whose SSD tier the region can record). */
  tierSlots?: number
  /** Records of each tier directory (a power of two). */
  tierRecords?: number
  /** Records of each stripe's change log (a power of two). */
  changeRecords?: number
  /** Tenant slots, the default tenant's included (1 to 64). */
  maxTenants?: number
}

/** The outcome of one item of a `get`. */
export interface GetResult {
  /**
   * `"OK"` (the first `length` bytes were filled), `"NOT_FOUND"`, or
   * `"TOO_LARGE"` (the buffers are shorter than the payload: `length`
   * says what is needed; nothing was copied).
   */
  result: string
  /** The payload's length in bytes. */
  length: number
}

/** Options of `Region.memfd`. */
export interface MemfdOptions {
  /** Back the region with 2 MiB huge pages. */
  hugetlb?: boolean
}

/** An inbox message as received. */
export interface Message {
  /** Application-defined kind; bit 31 marks a response to `call`. */
  kind: number
  /** Namespace of the keys. */
  ns: number
  /** Application-defined status (e.g. of a response). */
  status: number
  /** Request id (set by `call`; a reply carries the request's). */
  requestId: bigint
  /** Application-defined stamp (e.g. a send time). */
  stamp: bigint
  /** The sender's node id. */
  from: number
  /** The keys the message carries (16-byte Buffers). */
  keys: Array<Buffer>
}

/**
 * The 128-bit identity of a namespace (16 bytes): the same digest as C's
 * and Python's for the same fields. `node.namespace(fields)` registers it
 * in a region for the id every call takes.
 */
export declare function namespaceDigest(fields: NamespaceFields): Buffer

/**
 * What makes two blocks interchangeable: `namespaceDigest`'s and
 * `Node.namespace`'s fields.
 */
export interface NamespaceFields {
  /** The model's name (or bytes). */
  model: string | Uint8Array
  /** KV layout id. */
  kvLayout?: number
  /** Data type id. */
  dtype?: number
  /** Tensor-parallel rank. */
  tpRank?: number
  /** Tensor-parallel size. */
  tpSize?: number
  /** Pipeline-parallel rank. */
  ppRank?: number
  /** Tokens per block. */
  blockTokens?: number
  /** Anything else, as a number. */
  extra?: number | bigint
  /**
   * Anything else, as text or bytes of any length (an engine's
   * description of its blocks, a salt, a LoRA name).
   */
  salt?: string | Uint8Array
}

/** One node's counters (or every node's, summed). */
export interface NodeCounters {
  /** Keys found by gets and acquires. */
  hits: number
  /** Keys not found. */
  misses: number
  /** Blocks published. */
  inserts: number
  /** Stores refused because the key was stored already. */
  exists: number
  /** Blocks this node evicted. */
  evictions: number
  /** Payload bytes written. */
  bytesWritten: number
  /** Payload bytes read. */
  bytesRead: number
  /** Blocks asked of an SSD tier that did not come back within the wait. */
  tierTimeouts: number
}

/** A message to send: `kind` is required, the rest default to 0 / none. */
export interface Outgoing {
  /** Application-defined kind, below 2**31. */
  kind: number
  /** Namespace of the keys. */
  ns?: number
  /** Application-defined status. */
  status?: number
  /** Application-defined stamp. */
  stamp?: bigint
  /** The keys to carry (16-byte Buffers or bigints). */
  keys?: Keys
}

/** Whether each key is stored, and the longest stored prefix. */
export interface Presence {
  /** Length of the longest prefix of the keys whose blocks are stored. */
  prefix: number
  /** Per key: stored or not. */
  present: Array<boolean>
}

/** What a recovery did. */
export interface Recovered {
  /** Dead nodes whose slots were freed. */
  nodesFreed: number
  /** Pins of dead nodes dropped. */
  pinsDropped: number
  /** Unpublished writes of dead nodes aborted. */
  writesAborted: number
  /** Index entries dropped. */
  entriesDropped: number
  /** Blocks whose space was reclaimed. */
  blocksReclaimed: number
  /** Allocator chunks reclaimed. */
  chunksReclaimed: number
  /** Locks repaired. */
  locksRepaired: number
  /**
   * Unpublished writes of dead nodes not known quiet, kept allocated
   * until they are.
   */
  writesQuarantined: number
  /** Dead nodes not known quiet, fenced rather than freed. */
  nodesFenced: number
}

/** What a named root names. */
export interface RootValue {
  /** Region offset of the object. */
  offset: number
  /** Its bytes. */
  size: number
  /** An application-defined type tag. */
  tag: number
}

/** A snapshot of a node's and its region's counters. */
export interface Stats {
  /** This node's counters. */
  node: NodeCounters
  /** Every attached or dead node's counters, summed. */
  total: NodeCounters
  /** Attached nodes, a bit per node id. */
  aliveMask: bigint
  /** Nodes declared dead whose recovery is pending. */
  deadMask: bigint
  /** Published blocks. */
  liveBlocks: number
  /** Their payload bytes. */
  liveBytes: number
  /** Payload capacity of the region. */
  capacityBytes: number
  /** Blocks evicted since the region was formatted, by any node. */
  evictions: number
}

/** A tenant, its limits and its usage. */
export interface Tenant {
  /** Its name. */
  name: string
  /** Hard quota in payload bytes (0: none). */
  quota: number
  /** Guaranteed share in payload bytes. */
  share: number
  /** Relative weight. */
  priority: number
  /** Lifetime of its blocks in milliseconds (0: none). */
  ttlMs: number
  /** Its blocks are zeroed when reserved. */
  scrub: boolean
  /** Payload bytes of its blocks being written or stored. */
  bytes: number
  /** Its blocks being written or stored. */
  blocks: number
  /** Its blocks evicted. */
  evictions: number
  /** Of its evictions, blocks removed past their lifetime. */
  expired: number
  /** Reserves refused at its hard quota. */
  refused: number
  /** Being dropped. */
  dropping: boolean
}

/** The tier's counters. */
export interface TierCounters {
  /** Blocks copied to the drives. */
  spills: number
  /** Blocks put back into the region on request. */
  promotions: number
  /** Requests for blocks the tier does not hold, or whose slot failed. */
  misses: number
  /** I/O or checksum errors. */
  errors: number
  /** Blocks held now. */
  held: number
  /** Bytes written to the drives. */
  bytesWritten: number
  /** Bytes read from the drives. */
  bytesRead: number
  /** Blocks the drive read straight into the region. */
  directReads: number
  /** Bytes registered with io_uring as fixed buffers. */
  registeredBytes: number
  /** Directories on memory-backed file systems (tmpfs). */
  memoryDirs: number
  /** The I/O engine in use, or null. */
  engine?: string
  /** The tier thread runs at the highest best-effort I/O priority. */
  ioPriority: boolean
  /** The tier thread runs at a raised CPU priority. */
  cpuPriority: boolean
}

/**
 * Platform's table of a tier's options: each one's default by its
 * `Node.startTier` option name (camelCase of the C and Python name).
 */
export declare function tierOptionDefaults(): Record<string, number>

/**
 * Options of `Node.startTier`: left out, each keeps its default. They are
 * the tier's table (`TierOptions::FIELDS`) in camelCase; a test holds these
 * typings to it.
 */
export interface TierOptions {
  /** Largest block a slot holds, in bytes (2 MiB). */
  slotBytes?: number
  /** Bytes of slot file per directory (1 GiB). */
  capacity?: number
  /**
   * How full the region is (0 to 1) before cold blocks are copied out
   * (0.7).
   */
  highWater?: number
  /** Blocks copied out per round at most (64). */
  batch?: number
}

/** The package's version. */
export declare function version(): string

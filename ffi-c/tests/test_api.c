/* Every call of the C API, its results and its refusals (NULL arguments,
 * closed handles, bad sizes), against one anonymous region. */
#define _DEFAULT_SOURCE /* mkdtemp, usleep */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"

#define NS_BLOCKS 8
#define BLOCK 4096

static cxlkv_key key_of(uint64_t i) {
  cxlkv_key k = {i * 0x9e3779b97f4a7c15ull + 1, i};
  return k;
}

static unsigned char byte_of(cxlkv_key k, size_t at) {
  return (unsigned char)((k.lo >> (at % 7)) + at * 31);
}

static void test_version_and_results(void) {
  CHECK(strcmp(cxlkv_version(), CXLKV_VERSION_STRING) == 0);
  CHECK(CXLKV_RESULT_OK != 0);
  CHECK(strcmp(cxlkv_result_str(CXLKV_RESULT_EXISTS), "key exists") == 0);
  CHECK(strcmp(cxlkv_result_str(999999), "unknown result") == 0);
  char buf[8];
  size_t n = 0;
  EXPECT(cxlkv_last_error(buf, sizeof buf, NULL), CXLKV_RESULT_NULL_PARAMETER);
  OK(cxlkv_last_error(buf, sizeof buf, &n));
  CHECK(strlen(buf) < sizeof buf && n >= strlen(buf)); /* truncated, NUL-terminated */
}

static void test_refusals_without_handles(void) {
  cxlkv_region *r = NULL;
  cxlkv_node *node = NULL;
  EXPECT(cxlkv_region_open(NULL, &r), CXLKV_RESULT_NULL_PARAMETER);
  EXPECT(cxlkv_region_open("/nonexistent/cxlkv", NULL), CXLKV_RESULT_NULL_PARAMETER);
  EXPECT(cxlkv_region_open("/nonexistent/cxlkv", &r), CXLKV_RESULT_IO);
  CHECK(r == NULL); /* outputs written only on success */
  EXPECT(cxlkv_region_open("\xff\xfe", &r), CXLKV_RESULT_INVALID_STRING);
  EXPECT(cxlkv_node_attach(NULL, NULL, &node), CXLKV_RESULT_NULL_PARAMETER);
  EXPECT(cxlkv_node_stats(NULL, NULL), CXLKV_RESULT_NULL_PARAMETER);
  EXPECT(cxlkv_region_memfd(4096, false, &r), CXLKV_RESULT_OK);
  EXPECT(cxlkv_node_attach(r, NULL, &node), CXLKV_RESULT_NOT_INITIALIZED);
  EXPECT(cxlkv_region_format(r, NULL, CXLKV_FLUSH_COHERENT), CXLKV_RESULT_TOO_SMALL);
  cxlkv_capacities caps;
  OK(cxlkv_capacities_default(&caps));
  caps.n_stripes = 3; /* not a power of two */
  cxlkv_region_close(r);
  OK(cxlkv_region_memfd(16u << 20, false, &r));
  EXPECT(cxlkv_region_format(r, &caps, CXLKV_FLUSH_COHERENT), CXLKV_RESULT_INVALID_ARGUMENT);
  OK(cxlkv_capacities_default(&caps));
  EXPECT(cxlkv_region_format(r, &caps, 77), CXLKV_RESULT_INVALID_ARGUMENT);
  cxlkv_region_close(r);
  cxlkv_region_close(NULL);
  EXPECT(cxlkv_node_detach(NULL), CXLKV_RESULT_OK);
}

static cxlkv_node *attach(cxlkv_region *r, uint32_t mode) {
  cxlkv_node_options o;
  OK(cxlkv_node_options_default(&o));
  o.flush_mode = mode;
  cxlkv_node *node = NULL;
  OK(cxlkv_node_attach(r, &o, &node));
  CHECK(node != NULL);
  return node;
}

static void test_kv(cxlkv_node *node, uint32_t ns) {
  cxlkv_key keys[NS_BLOCKS];
  for (int i = 0; i < NS_BLOCKS; i++) keys[i] = key_of(100 + (uint64_t)i);

  /* Nothing stored yet. */
  size_t prefix = 99;
  uint8_t present[1] = {0xff};
  OK(cxlkv_lookup(node, ns, keys, NS_BLOCKS, present, &prefix));
  CHECK(prefix == 0 && present[0] == 0);

  /* Zero-copy write of blocks 0..3 and 5: reserve, store, publish. */
  cxlkv_reserve_item items[5];
  const int idx[5] = {0, 1, 2, 3, 5};
  for (int i = 0; i < 5; i++) {
    items[i].key = keys[idx[i]];
    items[i].len = BLOCK;
    items[i].tokens = 16;
    items[i].reserved = 0;
  }
  cxlkv_block blocks[5];
  cxlkv_result st[5];
  size_t n = 0;
  OK(cxlkv_reserve(node, ns, items, 5, blocks, st, &n));
  CHECK(n == 5);
  for (int i = 0; i < 5; i++) {
    CHECK(st[i] == CXLKV_RESULT_OK && blocks[i].data != NULL && blocks[i].len == BLOCK);
    for (size_t b = 0; b < BLOCK; b++) ((unsigned char *)blocks[i].data)[b] = byte_of(items[i].key, b);
  }
  /* A second reserve of a key being written reports it, per key. */
  cxlkv_block again[1];
  cxlkv_result st1[1];
  OK(cxlkv_reserve(node, ns, items, 1, again, st1, NULL));
  CHECK(st1[0] == CXLKV_RESULT_EXISTS && again[0].data == NULL);
  OK(cxlkv_publish(node, blocks, 5, st));
  for (int i = 0; i < 5; i++) CHECK(st[i] == CXLKV_RESULT_OK);
  /* Publishing twice is a stale handle, reported per block. */
  OK(cxlkv_publish(node, blocks, 1, st));
  CHECK(st[0] == CXLKV_RESULT_STALE_HANDLE);

  OK(cxlkv_lookup(node, ns, keys, NS_BLOCKS, present, &prefix));
  CHECK(prefix == 4);
  CHECK(present[0] == 0x2f); /* bits 0-3 and 5 */
  OK(cxlkv_lookup(node, ns, keys, NS_BLOCKS, NULL, &prefix));
  CHECK(prefix == 4);
  bool there = false;
  OK(cxlkv_exists(node, ns, &keys[5], &there));
  CHECK(there);
  OK(cxlkv_exists(node, ns, &keys[4], &there));
  CHECK(!there);
  OK(cxlkv_exists(node, ns + 1, &keys[5], &there));
  CHECK(!there); /* namespaces are separate */

  /* Zero-copy read: acquire, compare in place, release. */
  cxlkv_block got[NS_BLOCKS];
  cxlkv_result gst[NS_BLOCKS];
  OK(cxlkv_acquire(node, ns, keys, NS_BLOCKS, got, gst, &n));
  CHECK(n == 5);
  for (int i = 0; i < NS_BLOCKS; i++) {
    if (i < 4 || i == 5) {
      CHECK(gst[i] == CXLKV_RESULT_OK && got[i].len == BLOCK && got[i].tokens == 16);
      const unsigned char *p = (const unsigned char *)got[i].data;
      size_t bad = 0;
      for (size_t b = 0; b < BLOCK; b++) bad += p[b] != byte_of(keys[i], b);
      CHECK(bad == 0);
    } else {
      CHECK(gst[i] == CXLKV_RESULT_NOT_FOUND && got[i].data == NULL);
    }
  }
  /* A pinned block is not evicted. */
  cxlkv_evict_report ev;
  OK(cxlkv_evict(node, UINT64_MAX, &ev));
  CHECK(ev.blocks == 0);
  OK(cxlkv_release(node, got, NS_BLOCKS)); /* empty slots skipped */
  EXPECT(cxlkv_release(node, got, 1), CXLKV_RESULT_STALE_HANDLE);

  /* Abort frees the key for another writer. */
  cxlkv_reserve_item one = {keys[4], 100, 1, 0};
  cxlkv_block b4;
  OK(cxlkv_reserve(node, ns, &one, 1, &b4, st, NULL));
  CHECK(st[0] == CXLKV_RESULT_OK);
  OK(cxlkv_abort(node, &b4, 1, st));
  CHECK(st[0] == CXLKV_RESULT_OK);
  OK(cxlkv_exists(node, ns, &keys[4], &there));
  CHECK(!there);

  /* Copying put from K and V parts, then get into other parts. */
  unsigned char k[300], v[200];
  memset(k, 'k', sizeof k);
  memset(v, 'v', sizeof v);
  cxlkv_iovec parts[2] = {{k, sizeof k}, {v, sizeof v}};
  cxlkv_put_item puts[2] = {{keys[4], 16, 0, parts, 2}, {keys[0], 16, 0, parts, 1}};
  OK(cxlkv_put(node, ns, puts, 2, st));
  CHECK(st[0] == CXLKV_RESULT_OK);
  CHECK(st[1] == CXLKV_RESULT_EXISTS); /* never overwritten */
  unsigned char a[250], b[250], small[10];
  cxlkv_iovec out2[2] = {{a, sizeof a}, {b, sizeof b}};
  cxlkv_iovec out1[1] = {{small, sizeof small}};
  cxlkv_get_item gets[3] = {{keys[4], out2, 2}, {keys[0], out1, 1}, {keys[6], out1, 1}};
  uint64_t lens[3];
  OK(cxlkv_get(node, ns, gets, 3, lens, gst));
  CHECK(gst[0] == CXLKV_RESULT_OK && lens[0] == 500);
  CHECK(gst[1] == CXLKV_RESULT_TOO_LARGE && lens[1] == BLOCK);
  CHECK(gst[2] == CXLKV_RESULT_NOT_FOUND);
  CHECK(a[0] == 'k' && a[249] == 'k' && b[0] == 'k' && b[49] == 'k' && b[50] == 'v' && b[249] == 'v');

  /* Bad sizes and NULL arrays. */
  EXPECT(cxlkv_acquire(node, ns, NULL, 3, got, gst, NULL), CXLKV_RESULT_NULL_PARAMETER);
  EXPECT(cxlkv_acquire(node, ns, keys, 3, got, NULL, NULL), CXLKV_RESULT_NULL_PARAMETER);
  OK(cxlkv_acquire(node, ns, NULL, 0, NULL, NULL, &n));
  CHECK(n == 0);
  cxlkv_reserve_item huge = {keys[7], UINT64_MAX, 1, 0};
  OK(cxlkv_reserve(node, ns, &huge, 1, blocks, st, NULL));
  CHECK(st[0] == CXLKV_RESULT_TOO_LARGE);
  cxlkv_iovec bad = {NULL, 10};
  cxlkv_put_item badput = {keys[7], 1, 0, &bad, 1};
  EXPECT(cxlkv_put(node, ns, &badput, 1, st), CXLKV_RESULT_NULL_PARAMETER);
  /* A forged block is refused, not trusted. */
  cxlkv_block forged = got[0];
  forged.entry = 123456;
  OK(cxlkv_publish(node, &forged, 1, st));
  CHECK(st[0] == CXLKV_RESULT_STALE_HANDLE);

  cxlkv_stats s;
  OK(cxlkv_node_stats(node, &s));
  CHECK(s.live_blocks == 6 && s.live_bytes == 5 * BLOCK + 500);
  CHECK(s.node.hits >= 5 && s.total.hits == s.node.hits && s.alive_mask != 0 && s.dead_mask == 0);
  CHECK(s.capacity_bytes > 0);

  OK(cxlkv_evict(node, 1, &ev));
  CHECK(ev.blocks >= 1 && ev.bytes >= 1);
  OK(cxlkv_evict(node, UINT64_MAX, NULL));
  OK(cxlkv_node_stats(node, &s));
  CHECK(s.live_blocks == 0);
}

/* Namespaces are registered in the region: equal fields get one id on every
 * node, fields that differ in anything never share an id, nor a block. */
static void test_namespaces(cxlkv_node *a, cxlkv_node *b) {
  cxlkv_namespace base = {"llama-3-8b", 0, 1, 0, 2, 0, 16, 0, NULL, 0};
  uint32_t ia = 0, ia2 = 0;
  OK(cxlkv_namespace_register(a, &base, &ia));
  OK(cxlkv_namespace_register(b, &base, &ia2));
  CHECK(ia == ia2 && ia >= 0x80000000u);
  cxlkv_namespace variants[10];
  for (int i = 0; i < 10; i++) variants[i] = base;
  variants[0].model = "llama-3-8c";
  variants[1].kv_layout = 1;
  variants[2].dtype = 2;
  variants[3].tp_rank = 1;
  variants[4].tp_size = 4;
  variants[5].pp_rank = 1;
  variants[6].block_tokens = 32;
  variants[7].extra = 1;
  variants[8].salt = (const uint8_t *)"user-100840";
  variants[8].salt_len = 11;
  variants[9].salt = (const uint8_t *)"user-17144";
  variants[9].salt_len = 10;
  cxlkv_key key = {0x1234, 0x5678};
  unsigned char payload[64];
  memset(payload, 7, sizeof payload);
  cxlkv_iovec part = {payload, sizeof payload};
  cxlkv_put_item put = {key, 16, 0, &part, 1};
  cxlkv_result st;
  OK(cxlkv_put(a, ia, &put, 1, &st));
  CHECK(st == CXLKV_RESULT_OK);
  uint32_t ids[10];
  for (int i = 0; i < 10; i++) {
    OK(cxlkv_namespace_register(b, &variants[i], &ids[i]));
    CHECK(ids[i] != ia);
    for (int j = 0; j < i; j++) CHECK(ids[i] != ids[j]);
    bool there = true;
    OK(cxlkv_exists(b, ids[i], &key, &there));
    CHECK(!there);
  }
  bool there = false;
  OK(cxlkv_exists(b, ia, &key, &there));
  CHECK(there);
  /* The digest alone: the specified encoding's test vector. */
  cxlkv_namespace vec = {"m", 1, 2, 3, 4, 5, 6, 7, (const uint8_t *)"s", 1};
  uint8_t d[16];
  OK(cxlkv_namespace_digest(&vec, d));
  static const uint8_t want[16] = {0x39, 0x43, 0x89, 0x5f, 0x2f, 0x6c, 0x5b, 0x42,
                                   0xc4, 0x0f, 0xa5, 0x4b, 0xa1, 0x42, 0xc4, 0x83};
  CHECK(memcmp(d, want, 16) == 0);
  EXPECT(cxlkv_namespace_digest(NULL, d), CXLKV_RESULT_NULL_PARAMETER);
  EXPECT(cxlkv_namespace_digest(&vec, NULL), CXLKV_RESULT_NULL_PARAMETER);
  EXPECT(cxlkv_namespace_register(a, NULL, &ia), CXLKV_RESULT_NULL_PARAMETER);
  EXPECT(cxlkv_namespace_register(NULL, &base, &ia), CXLKV_RESULT_NULL_PARAMETER);
  cxlkv_namespace no_salt = base;
  no_salt.salt_len = 3; /* bytes promised, no pointer */
  EXPECT(cxlkv_namespace_register(a, &no_salt, &ia), CXLKV_RESULT_NULL_PARAMETER);
  OK(cxlkv_evict(a, UINT64_MAX, NULL)); /* the next test starts empty */
}

static void test_keys(void) {
  uint32_t toks[40];
  for (int i = 0; i < 40; i++) toks[i] = (uint32_t)i;
  cxlkv_key k1[4], k2[4];
  size_t n1 = 0, n2 = 0;
  OK(cxlkv_chain_keys(NULL, toks, 40, 16, k1, 4, &n1));
  CHECK(n1 == 2); /* a partial last block gets no key */
  toks[20] = 7;
  OK(cxlkv_chain_keys(NULL, toks, 40, 16, k2, 4, &n2));
  CHECK(n2 == 2 && memcmp(&k1[0], &k2[0], sizeof k1[0]) == 0 && memcmp(&k1[1], &k2[1], sizeof k1[1]) != 0);
  EXPECT(cxlkv_chain_keys(NULL, toks, 40, 0, k1, 4, &n1), CXLKV_RESULT_INVALID_ARGUMENT);
  OK(cxlkv_chain_keys(&k1[0], toks, 16, 16, k2, 1, &n2));
  CHECK(n2 == 1 && memcmp(&k2[0], &k1[0], sizeof k1[0]) != 0); /* the parent matters */
}

static void test_shared_memory_library(cxlkv_node *a, cxlkv_node *b) {
  /* Locks: allocated once, exclusive across nodes. */
  uint32_t l1 = 99, l2 = 99;
  OK(cxlkv_lock_alloc(a, &l1));
  OK(cxlkv_lock_alloc(b, &l2));
  CHECK(l1 != l2);
  cxlkv_lock_ticket t;
  OK(cxlkv_lock_acquire(a, l1, &t));
  CHECK(t.lock == l1);
  cxlkv_lock_ticket t2;
  /* Held by this thread: a second acquire could never be granted. */
  EXPECT(cxlkv_lock_acquire(b, l1, &t2), CXLKV_RESULT_BUSY);
  EXPECT(cxlkv_lock_acquire(a, l1, &t2), CXLKV_RESULT_BUSY);
  OK(cxlkv_lock_acquire(b, l2, &t2));
  OK(cxlkv_lock_release(b, &t2));

  /* A raw allocation reachable through a named root. */
  uint64_t off = 0;
  OK(cxlkv_alloc(a, 1000, &off));
  void *p = NULL;
  OK(cxlkv_offset_to_ptr(a, off, 1000, &p));
  memset(p, 0x5a, 1000);
  OK(cxlkv_flush(a, p, 1000));
  cxlkv_root root = {off, 1000, 42, 0};
  OK(cxlkv_root_put(a, "counters", &root));
  EXPECT(cxlkv_root_put(b, "counters", &root), CXLKV_RESULT_EXISTS);
  OK(cxlkv_lock_release(a, &t));
  EXPECT(cxlkv_lock_release(a, &t), CXLKV_RESULT_REVOKED); /* this grant is over */

  cxlkv_root seen;
  OK(cxlkv_root_get(b, "counters", &seen));
  CHECK(seen.offset == off && seen.size == 1000 && seen.tag == 42);
  void *q = NULL;
  OK(cxlkv_offset_to_ptr(b, seen.offset, seen.size, &q));
  OK(cxlkv_invalidate(b, q, 1000));
  CHECK(((unsigned char *)q)[999] == 0x5a);
  uint64_t back = 0;
  OK(cxlkv_ptr_to_offset(b, (unsigned char *)q + 10, &back));
  CHECK(back == off + 10);

  /* Refusals: outside the payload area, bad names, unknown locks. */
  EXPECT(cxlkv_offset_to_ptr(a, 0, 64, &p), CXLKV_RESULT_OUT_OF_BOUNDS);
  EXPECT(cxlkv_ptr_to_offset(a, &back, &back), CXLKV_RESULT_OUT_OF_BOUNDS);
  EXPECT(cxlkv_flush(a, &back, 8), CXLKV_RESULT_OUT_OF_BOUNDS);
  EXPECT(cxlkv_root_get(a, "", &seen), CXLKV_RESULT_INVALID_ARGUMENT);
  EXPECT(cxlkv_root_get(a, "a-name-longer-than-thirty-two-bytes", &seen), CXLKV_RESULT_INVALID_ARGUMENT);
  EXPECT(cxlkv_root_get(a, "missing", &seen), CXLKV_RESULT_NOT_FOUND);
  EXPECT(cxlkv_lock_acquire(a, 100000, &t), CXLKV_RESULT_INVALID_ARGUMENT);
  EXPECT(cxlkv_lock_free(a, 100000), CXLKV_RESULT_INVALID_ARGUMENT);
  EXPECT(cxlkv_alloc(a, UINT64_MAX, &off), CXLKV_RESULT_TOO_LARGE);
  EXPECT(cxlkv_free(a, 12345), CXLKV_RESULT_INVALID_ARGUMENT); /* the caller's mistake, not damage */

  OK(cxlkv_root_destroy(b, "counters", &seen));
  CHECK(seen.offset == off);
  EXPECT(cxlkv_root_destroy(b, "counters", NULL), CXLKV_RESULT_NOT_FOUND);
  OK(cxlkv_free(b, off));

  /* root_free: the root and the allocation it names go in one step, here
   * by another node than the allocator; a root naming no allocation is
   * refused and kept. */
  uint64_t obj = 0;
  OK(cxlkv_alloc(a, 512, &obj));
  cxlkv_root named = {obj, 512, 3, 0};
  OK(cxlkv_root_put(a, "obj", &named));
  cxlkv_root inside = {obj + 64, 64, 4, 0};
  OK(cxlkv_root_put(a, "inside", &inside));
  EXPECT(cxlkv_root_free(b, "inside", NULL), CXLKV_RESULT_INVALID_ARGUMENT);
  OK(cxlkv_root_get(b, "inside", &seen));
  OK(cxlkv_root_destroy(b, "inside", NULL));
  OK(cxlkv_root_free(b, "obj", &seen));
  CHECK(seen.offset == obj && seen.size == 512 && seen.tag == 3);
  EXPECT(cxlkv_root_get(a, "obj", &seen), CXLKV_RESULT_NOT_FOUND);
  EXPECT(cxlkv_root_free(b, "obj", NULL), CXLKV_RESULT_NOT_FOUND);
  EXPECT(cxlkv_free(a, obj), CXLKV_RESULT_INVALID_ARGUMENT); /* freed already */
  OK(cxlkv_lock_free(b, l1));
  OK(cxlkv_lock_free(a, l2));
  EXPECT(cxlkv_lock_free(a, l2), CXLKV_RESULT_NOT_FOUND);
}

/* Misuse is refused and changes nothing. */
static void test_misuse_is_refused(cxlkv_region *r, cxlkv_node *a, uint32_t ns) {
  /* A stale ticket does not release the current grant. */
  uint32_t l = 99;
  OK(cxlkv_lock_alloc(a, &l));
  cxlkv_lock_ticket old, cur;
  OK(cxlkv_lock_acquire(a, l, &old));
  OK(cxlkv_lock_release(a, &old));
  OK(cxlkv_lock_acquire(a, l, &cur));
  EXPECT(cxlkv_lock_release(a, &old), CXLKV_RESULT_REVOKED);
  OK(cxlkv_lock_release(a, &cur)); /* still held until now */

  /* A node holding an application lock cannot detach; it stays usable. */
  cxlkv_node *c = attach(r, CXLKV_FLUSH_AUTO);
  OK(cxlkv_lock_acquire(c, l, &cur));
  EXPECT(cxlkv_node_detach(c), CXLKV_RESULT_BUSY);
  uint32_t idc = 99;
  OK(cxlkv_node_id(c, &idc));
  OK(cxlkv_lock_release(c, &cur));
  OK(cxlkv_node_detach(c));
  OK(cxlkv_lock_acquire(a, l, &cur)); /* not stranded */
  OK(cxlkv_lock_release(a, &cur));
  OK(cxlkv_lock_free(a, l));

  /* Releasing a reservation is refused; it can still be published. */
  cxlkv_reserve_item it = {key_of(900), BLOCK, 16, 0};
  cxlkv_block w;
  cxlkv_result st[1];
  OK(cxlkv_reserve(a, ns, &it, 1, &w, st, NULL));
  CHECK(st[0] == CXLKV_RESULT_OK);
  for (size_t i = 0; i < BLOCK; i++) ((unsigned char *)w.data)[i] = byte_of(it.key, i);
  EXPECT(cxlkv_release(a, &w, 1), CXLKV_RESULT_NOT_PINNED);
  OK(cxlkv_publish(a, &w, 1, st));
  CHECK(st[0] == CXLKV_RESULT_OK);

  /* A KV block's payload is not a raw allocation: free refuses it and the
   * next allocation does not get its bytes. */
  cxlkv_block got;
  size_t n = 0;
  OK(cxlkv_acquire(a, ns, &it.key, 1, &got, st, &n));
  CHECK(n == 1);
  EXPECT(cxlkv_free(a, got.offset), CXLKV_RESULT_INVALID_ARGUMENT);
  uint64_t raw = 0;
  OK(cxlkv_alloc(a, BLOCK, &raw));
  CHECK(raw + BLOCK <= got.offset || raw >= got.offset + BLOCK);
  void *p = NULL;
  OK(cxlkv_offset_to_ptr(a, raw, BLOCK, &p));
  memset(p, 0xee, BLOCK);
  size_t bad = 0;
  for (size_t i = 0; i < BLOCK; i++) bad += ((const unsigned char *)got.data)[i] != byte_of(it.key, i);
  CHECK(bad == 0);
  OK(cxlkv_release(a, &got, 1));
  OK(cxlkv_free(a, raw));
  cxlkv_finding f[4];
  size_t nf = 99;
  OK(cxlkv_check(a, f, 4, &nf));
  CHECK(nf == 0);
}

/* Remove picks keys (a pinned one stays); clearing namespaces removes only
   theirs. */
/* A change cursor on one node reports what another node stores and removes
 * afterwards, once, filtered by namespace, a page at a time. */
static void test_change_cursor(cxlkv_node *a, cxlkv_node *b) {
  cxlkv_key keys[3] = {{1, 91}, {2, 91}, {3, 91}};
  unsigned char body[40];
  memset(body, 'c', sizeof body);
  cxlkv_iovec part = {body, sizeof body};
  cxlkv_put_item puts[3] = {{keys[0], 4, 0, &part, 1}, {keys[1], 4, 0, &part, 1}, {keys[2], 4, 0, &part, 1}};
  cxlkv_result st[3];
  OK(cxlkv_put(b, 61, puts, 1, st)); /* before the cursor: not reported */
  cxlkv_change_cursor *cur = NULL;
  OK(cxlkv_change_cursor_open(a, &cur));
  cxlkv_change ch[4];
  size_t n = 99;
  uint32_t gaps = 99;
  OK(cxlkv_change_cursor_poll(cur, a, NULL, 0, ch, 4, &n, &gaps));
  CHECK(n == 0 && gaps == 0);
  OK(cxlkv_put(b, 61, &puts[1], 2, st));
  OK(cxlkv_put(b, 62, puts, 1, st));
  bool removed[1] = {false};
  OK(cxlkv_remove(b, 61, keys, 1, removed));
  CHECK(removed[0]);
  uint32_t only = 61;
  /* One at a time: stores of keys 1 and 2, then the removal of key 0. */
  size_t seen = 0, stores = 0;
  bool removal = false;
  for (int i = 0; i < 8; i++) {
    OK(cxlkv_change_cursor_poll(cur, a, &only, 1, ch, 1, &n, NULL));
    if (n == 0) break;
    CHECK(n == 1 && ch[0].ns == 61 && ch[0].node == 1 && ch[0].len == sizeof body);
    if (ch[0].stored) {
      stores++;
      CHECK(ch[0].tokens == 4 && ch[0].key.hi == 91);
    } else {
      removal = ch[0].key.lo == 1;
    }
    seen++;
  }
  CHECK(seen == 3 && stores == 2 && removal);
  OK(cxlkv_change_cursor_poll(cur, a, NULL, 0, ch, 4, &n, &gaps));
  CHECK(n == 0 && gaps == 0); /* once each; namespace 62's store was left out */
  EXPECT(cxlkv_change_cursor_poll(NULL, a, NULL, 0, ch, 4, &n, NULL), CXLKV_RESULT_NULL_PARAMETER);
  EXPECT(cxlkv_change_cursor_poll(cur, a, NULL, 0, NULL, 4, &n, NULL), CXLKV_RESULT_NULL_PARAMETER);
  EXPECT(cxlkv_change_cursor_open(NULL, &cur), CXLKV_RESULT_NULL_PARAMETER);
  cxlkv_change_cursor_close(cur);
  EXPECT(cxlkv_change_cursor_poll(cur, a, NULL, 0, ch, 4, &n, NULL), CXLKV_RESULT_INVALID_HANDLE);
  cxlkv_change_cursor_close(cur); /* twice: nothing */
  cxlkv_change_cursor_close(NULL);
  uint32_t both[2] = {61, 62};
  OK(cxlkv_clear_namespaces(b, both, 2, NULL));
}

static void test_remove_and_clear(cxlkv_node *node) {
  cxlkv_key keys[3] = {{1, 71}, {2, 71}, {3, 71}};
  unsigned char body[100];
  memset(body, 'r', sizeof body);
  cxlkv_iovec part = {body, sizeof body};
  cxlkv_put_item puts[3] = {{keys[0], 1, 0, &part, 1}, {keys[1], 1, 0, &part, 1}, {keys[2], 1, 0, &part, 1}};
  cxlkv_result st[3];
  OK(cxlkv_put(node, 41, puts, 3, st));
  OK(cxlkv_put(node, 42, puts, 3, st));
  cxlkv_block pinned;
  cxlkv_result pst;
  OK(cxlkv_acquire(node, 41, &keys[1], 1, &pinned, &pst, NULL));
  CHECK(pst == CXLKV_RESULT_OK);
  bool removed[3] = {false, true, false};
  OK(cxlkv_remove(node, 41, keys, 3, removed));
  CHECK(removed[0] && !removed[1] && removed[2]); /* key 1 is pinned */
  bool there = false;
  OK(cxlkv_exists(node, 41, &keys[1], &there));
  CHECK(there);
  OK(cxlkv_exists(node, 41, &keys[0], &there));
  CHECK(!there);
  OK(cxlkv_remove(node, 41, keys, 1, removed));
  CHECK(!removed[0]); /* not stored any more */
  EXPECT(cxlkv_remove(node, 41, NULL, 1, removed), CXLKV_RESULT_NULL_PARAMETER);
  EXPECT(cxlkv_remove(node, 41, keys, 1, NULL), CXLKV_RESULT_NULL_PARAMETER);
  OK(cxlkv_release(node, &pinned, 1));

  uint32_t both[2] = {41, 43};
  cxlkv_evict_report ev = {0, 0};
  OK(cxlkv_clear_namespaces(node, both, 2, &ev));
  CHECK(ev.blocks == 1 && ev.bytes == sizeof body);
  OK(cxlkv_exists(node, 41, &keys[1], &there));
  CHECK(!there);
  OK(cxlkv_exists(node, 42, &keys[1], &there));
  CHECK(there); /* another namespace's blocks stay */
  EXPECT(cxlkv_clear_namespaces(node, NULL, 1, NULL), CXLKV_RESULT_NULL_PARAMETER);
  OK(cxlkv_clear_namespaces(node, NULL, 0, NULL));
  uint32_t other = 42;
  OK(cxlkv_clear_namespaces(node, &other, 1, &ev));
  CHECK(ev.blocks == 3);
}

/* Tenants: a quota held by evicting the tenant's own blocks, two tenants
   never sharing a block, listing, a live change of limits, and a drop that
   frees everything while the other tenant keeps its blocks. */
static void test_tenants(cxlkv_node *a, cxlkv_node *b) {
  cxlkv_tenant_limits lim = {64 * 1024, 0, 0, 2, 0};
  cxlkv_tenant busy, quiet, found;
  OK(cxlkv_tenant_add(a, "busy", &lim, &busy));
  OK(cxlkv_tenant_add(b, "quiet", NULL, &quiet));
  CHECK(busy.slot != 0 && quiet.slot != busy.slot);
  EXPECT(cxlkv_tenant_add(b, "busy", NULL, &found), CXLKV_RESULT_EXISTS);
  EXPECT(cxlkv_tenant_add(b, "", NULL, &found), CXLKV_RESULT_INVALID_ARGUMENT);
  EXPECT(cxlkv_tenant_add(b, "a-name-longer-than-twenty", NULL, &found), CXLKV_RESULT_INVALID_ARGUMENT);
  cxlkv_tenant_limits forever = {0, 0, (1ull << 40) + 1, 0, 0};
  EXPECT(cxlkv_tenant_add(b, "ttl", &forever, &found), CXLKV_RESULT_INVALID_ARGUMENT);
  cxlkv_tenant_limits odd_scrub = {0, 0, 0, 0, 2};
  EXPECT(cxlkv_tenant_add(b, "odd", &odd_scrub, &found), CXLKV_RESULT_INVALID_ARGUMENT);
  EXPECT(cxlkv_tenant_add(b, "x", NULL, NULL), CXLKV_RESULT_NULL_PARAMETER);
  OK(cxlkv_tenant_find(b, "busy", &found));
  CHECK(found.slot == busy.slot && found.nonce == busy.nonce);
  EXPECT(cxlkv_tenant_find(b, "nobody", &found), CXLKV_RESULT_NO_TENANT);

  cxlkv_namespace nsf = {"tenant-model", 0, 0, 0, 1, 0, 16, 0, NULL, 0};
  uint32_t nb = 0, nq = 0, nd = 0;
  OK(cxlkv_namespace_register_in(a, busy, &nsf, &nb));
  OK(cxlkv_namespace_register_in(b, quiet, &nsf, &nq));
  cxlkv_tenant def = {0, 0};
  OK(cxlkv_namespace_register_in(b, def, &nsf, &nd));
  CHECK(nb != nq && nq != nd && nb != nd); /* one model, three namespaces */

  unsigned char body[10000];
  memset(body, 't', sizeof body);
  cxlkv_iovec part = {body, sizeof body};
  for (uint64_t i = 0; i < 20; i++) {
    cxlkv_put_item it = {key_of(500 + i), 16, 0, &part, 1};
    cxlkv_result st;
    OK(cxlkv_put(i % 2 ? a : b, nb, &it, 1, &st));
    CHECK(st == CXLKV_RESULT_OK);
  }
  cxlkv_put_item q = {key_of(500), 16, 0, &part, 1};
  cxlkv_result st;
  OK(cxlkv_put(b, nq, &q, 1, &st));
  CHECK(st == CXLKV_RESULT_OK); /* the same key, another tenant: its own block */

  cxlkv_tenant_info list[8];
  size_t n = 0;
  OK(cxlkv_tenant_list(a, list, 8, &n));
  CHECK(n == 3 && strcmp(list[0].name, "default") == 0);
  int seen = 0;
  for (size_t i = 0; i < n; i++) {
    if (list[i].id.slot == busy.slot) {
      CHECK(strcmp(list[i].name, "busy") == 0 && list[i].limits.quota == 64 * 1024 && list[i].limits.priority == 2);
      CHECK(list[i].bytes <= 64 * 1024 && list[i].bytes == list[i].blocks * sizeof body && list[i].evictions > 0);
      seen++;
    }
    if (list[i].id.slot == quiet.slot) {
      CHECK(list[i].bytes == sizeof body && list[i].blocks == 1 && list[i].dropping == 0);
      seen++;
    }
  }
  CHECK(seen == 2);
  OK(cxlkv_tenant_list(a, NULL, 0, &n));
  CHECK(n == 3);

  cxlkv_tenant_limits lower = {20000, 0, 0, 0, 0};
  OK(cxlkv_tenant_set(b, busy, &lower));
  cxlkv_put_item more = {key_of(600), 16, 0, &part, 1};
  OK(cxlkv_put(a, nb, &more, 1, &st));
  CHECK(st == CXLKV_RESULT_OK);
  OK(cxlkv_tenant_list(a, list, 8, &n));
  for (size_t i = 0; i < n; i++) {
    if (list[i].id.slot == busy.slot) CHECK(list[i].bytes <= 20000);
  }
  EXPECT(cxlkv_tenant_set(b, def, &lower), CXLKV_RESULT_INVALID_ARGUMENT);

  cxlkv_evict_report ev = {0, 0};
  OK(cxlkv_tenant_drop(a, busy, &ev));
  CHECK(ev.blocks >= 1 && ev.bytes == ev.blocks * sizeof body);
  EXPECT(cxlkv_tenant_drop(a, busy, &ev), CXLKV_RESULT_NO_TENANT);
  EXPECT(cxlkv_tenant_find(b, "busy", &found), CXLKV_RESULT_NO_TENANT);
  EXPECT(cxlkv_put(a, nb, &more, 1, &st), CXLKV_RESULT_NO_TENANT); /* a dropped tenant takes no block */
  bool there = false;
  cxlkv_key k500 = key_of(500);
  OK(cxlkv_exists(a, nq, &k500, &there));
  CHECK(there);
  OK(cxlkv_tenant_drop(b, quiet, NULL));
  EXPECT(cxlkv_tenant_list(NULL, list, 8, &n), CXLKV_RESULT_NULL_PARAMETER);

  /* A lifetime: once it has passed, the block is missing to every reader
     (only what must hold after the wait is checked, not before it). */
  cxlkv_tenant_limits brief = {0, 0, 30, 0, 1}; /* and its blocks zeroed when reserved */
  cxlkv_tenant shortlived;
  uint32_t ns_short = 0;
  OK(cxlkv_tenant_add(a, "brief", &brief, &shortlived));
  OK(cxlkv_namespace_register_in(a, shortlived, &nsf, &ns_short));
  cxlkv_put_item once = {key_of(700), 16, 0, &part, 1};
  OK(cxlkv_put(a, ns_short, &once, 1, &st));
  CHECK(st == CXLKV_RESULT_OK);
  usleep(60 * 1000);
  cxlkv_key k700 = key_of(700);
  OK(cxlkv_exists(b, ns_short, &k700, &there));
  CHECK(!there);
  size_t hit = 99;
  OK(cxlkv_lookup(b, ns_short, &k700, 1, NULL, &hit));
  CHECK(hit == 0);
  OK(cxlkv_put(b, ns_short, &once, 1, &st)); /* a put replaces it */
  CHECK(st == CXLKV_RESULT_OK);
  OK(cxlkv_tenant_list(a, list, 8, &n));
  for (size_t i = 0; i < n; i++) {
    if (list[i].id.slot == shortlived.slot)
      CHECK(list[i].limits.ttl_ms == 30 && list[i].limits.scrub == 1 && list[i].expired == 1 && list[i].blocks == 1);
  }
  OK(cxlkv_tenant_drop(a, shortlived, NULL));
}

/* An SSD tier on its own node: blocks copied to a disk directory, evicted,
   and got back byte-exact through cxlkv_get. */
static void test_tier(cxlkv_region *r, cxlkv_node *user) {
  char dir[] = "/var/tmp/cxlkv-c-tier.XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  const char *dirs[] = {dir};
  cxlkv_tier_options to;
  EXPECT(cxlkv_tier_options_default(NULL), CXLKV_RESULT_NULL_PARAMETER);
  OK(cxlkv_tier_options_default(&to));
  cxlkv_tier *t = NULL;
  EXPECT(cxlkv_tier_start(r, &to, NULL, &t), CXLKV_RESULT_INVALID_ARGUMENT); /* no directory */
  EXPECT(cxlkv_tier_start(r, NULL, NULL, &t), CXLKV_RESULT_NULL_PARAMETER);
  to.dirs = dirs;
  to.n_dirs = 1;
  to.slot_bytes = 64u << 10;
  to.capacity = 8u << 20;
  to.high_water = 1.0;
  CHECK(to.batch == 64); /* the table's default */
  to.batch = 4;
  to.high_water = 1.5; /* refused by the tier: a fraction from 0 to 1 */
  EXPECT(cxlkv_tier_start(r, &to, NULL, &t), CXLKV_RESULT_INVALID_ARGUMENT);
  to.high_water = 1.0;
  OK(cxlkv_tier_start(r, &to, NULL, &t));
  enum { N = 8, LEN = 20000 };
  static unsigned char data[N][LEN], back[N][LEN];
  cxlkv_iovec pin[N], pout[N];
  cxlkv_put_item put[N];
  cxlkv_get_item get[N];
  cxlkv_result st[N];
  uint64_t lens[N];
  for (int i = 0; i < N; i++) {
    for (int j = 0; j < LEN; j++) data[i][j] = (unsigned char)(i * 31 + j);
    pin[i].base = data[i];
    pin[i].len = LEN;
    pout[i].base = back[i];
    pout[i].len = LEN;
    cxlkv_key k = {0x7469657200000000ull + (uint64_t)i, 42};
    put[i] = (cxlkv_put_item){k, 16, 0, &pin[i], 1};
    get[i] = (cxlkv_get_item){k, &pout[i], 1};
  }
  OK(cxlkv_put(user, 5, put, N, st));
  for (int i = 0; i < N; i++) CHECK(st[i] == CXLKV_RESULT_OK);
  uint64_t n = 0;
  OK(cxlkv_tier_spill_all(t, &n));
  CHECK(n >= N); /* and the blocks earlier tests left */
  OK(cxlkv_evict(user, UINT64_MAX, NULL));
  OK(cxlkv_get(user, 5, get, N, lens, st));
  for (int i = 0; i < N; i++) {
    CHECK(st[i] == CXLKV_RESULT_OK && lens[i] == LEN);
    CHECK(memcmp(back[i], data[i], LEN) == 0);
  }
  cxlkv_tier_counters ts;
  OK(cxlkv_tier_stats(t, &ts));
  CHECK(ts.promotions == N && ts.held == n && ts.errors == 0);
  CHECK(ts.bytes_read > 0 && ts.bytes_written > 0 && ts.memory_dirs <= 1);
  OK(cxlkv_tier_stop(t));
  EXPECT(cxlkv_tier_stats(t, &ts), CXLKV_RESULT_INVALID_HANDLE);
  OK(cxlkv_tier_stop(t));
  char path[sizeof dir + 32];
  snprintf(path, sizeof path, "%s/cxlkv-tier.slots", dir);
  CHECK(unlink(path) == 0 && rmdir(dir) == 0);
}

/* A region file gets the mode asked, whatever the umask; a mode its owner
 * cannot read and write is refused. */
static void test_file_mode(void) {
  char path[64];
  snprintf(path, sizeof path, "/dev/shm/cxlkv-c-mode-%d", (int)getpid());
  mode_t old = umask(077);
  cxlkv_region *r = NULL;
  OK(cxlkv_region_create_mode(path, 4u << 20, true, 0660, &r));
  umask(old);
  struct stat st;
  CHECK(stat(path, &st) == 0);
  CHECK((st.st_mode & 0777) == 0660);
  cxlkv_region_close(r);
  r = NULL;
  EXPECT(cxlkv_region_create_mode(path, 4u << 20, true, 0400, &r), CXLKV_RESULT_INVALID_ARGUMENT);
  CHECK(r == NULL);
  OK(cxlkv_region_create(path, 4u << 20, true, &r));
  CHECK(stat(path, &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  cxlkv_region_close(r);
  unlink(path);
}

int main(void) {
  test_version_and_results();
  test_file_mode();
  test_refusals_without_handles();
  test_keys();

  cxlkv_region *r = NULL;
  OK(cxlkv_region_memfd(64u << 20, false, &r));
  cxlkv_capacities caps;
  OK(cxlkv_capacities_default(&caps));
  caps.chunk_shift = 16;
  OK(cxlkv_region_format(r, &caps, CXLKV_FLUSH_AUTO));
  uint64_t size = 0;
  OK(cxlkv_region_size(r, &size));
  CHECK(size == 64u << 20);

  cxlkv_node *a = attach(r, CXLKV_FLUSH_AUTO);
  cxlkv_node *b = attach(r, CXLKV_FLUSH_AUTO);
  EXPECT(cxlkv_region_format(r, NULL, CXLKV_FLUSH_AUTO), CXLKV_RESULT_BUSY);
  uint32_t ida = 9, idb = 9;
  OK(cxlkv_node_id(a, &ida));
  OK(cxlkv_node_id(b, &idb));
  CHECK(ida != idb);
  cxlkv_node_options o;
  OK(cxlkv_node_options_default(&o));
  o.node_id = ida;
  cxlkv_node *dup = NULL;
  EXPECT(cxlkv_node_attach(r, &o, &dup), CXLKV_RESULT_NODE_BUSY);
  o.node_id = CXLKV_ANY_NODE;
  o.lease_ms = 0;
  EXPECT(cxlkv_node_attach(r, &o, &dup), CXLKV_RESULT_INVALID_ARGUMENT);

  cxlkv_namespace nsf = {"test-model", 0, 0, 0, 1, 0, 16, 0, NULL, 0};
  uint32_t ns = 0;
  OK(cxlkv_namespace_register(a, &nsf, &ns));
  test_namespaces(a, b);
  test_change_cursor(a, b);
  test_kv(a, ns);
  test_shared_memory_library(a, b);
  test_misuse_is_refused(r, a, ns);
  test_remove_and_clear(a);
  test_tenants(a, b);
  test_tier(r, b);

  cxlkv_recover_report rep;
  OK(cxlkv_recover(b, &rep));
  CHECK(rep.nodes_freed == 0);
  /* An operator's word that a node is quiet: said only of a dead node. */
  bool said = true;
  OK(cxlkv_declare_quiet(b, ida, &said));
  CHECK(!said);
  EXPECT(cxlkv_declare_quiet(b, caps.max_nodes, &said), CXLKV_RESULT_BAD_NODE);
  EXPECT(cxlkv_declare_quiet(b, ida, NULL), CXLKV_RESULT_NULL_PARAMETER);
  EXPECT(cxlkv_declare_quiet(NULL, ida, &said), CXLKV_RESULT_NULL_PARAMETER);
  cxlkv_finding f[4];
  size_t nf = 99;
  OK(cxlkv_check(a, f, 4, &nf));
  CHECK(nf == 0);

  /* Closed handles are refused, not used. */
  cxlkv_region_close(r);
  EXPECT(cxlkv_region_size(r, &size), CXLKV_RESULT_INVALID_HANDLE);
  cxlkv_region_close(r);
  cxlkv_stats s;
  OK(cxlkv_node_stats(a, &s)); /* the node keeps the mapping */
  OK(cxlkv_node_detach(b));
  EXPECT(cxlkv_node_id(b, &idb), CXLKV_RESULT_INVALID_HANDLE);
  EXPECT(cxlkv_lookup(b, 0, NULL, 0, NULL, &nf), CXLKV_RESULT_INVALID_HANDLE);
  OK(cxlkv_node_detach(b));
  /* A pointer that is not a node of this library. */
  EXPECT(cxlkv_node_id((cxlkv_node *)(void *)r, &idb), CXLKV_RESULT_INVALID_HANDLE);
  OK(cxlkv_node_detach(a));

  printf("C API test_api: %d checks passed\n", checks_run);
  return 0;
}

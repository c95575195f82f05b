/* cxlkv from C: a region in /dev/shm, one node, one block put and read back
 * zero-copy. Build: cc hello.c $(pkg-config --cflags --libs cxlkv) */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cxlkv.h"

static int fail(const char *what, cxlkv_result r) {
  fprintf(stderr, "%s: %s\n", what, cxlkv_result_str((uint32_t)r));
  return 1;
}

int main(void) {
  char path[64];
  snprintf(path, sizeof path, "/dev/shm/cxlkv-hello-%d", (int)getpid());
  cxlkv_region *region = NULL;
  cxlkv_result r = cxlkv_region_create(path, 64u << 20, true, &region);
  if (r != CXLKV_RESULT_OK) return fail("create", r);
  r = cxlkv_region_format(region, NULL, CXLKV_FLUSH_AUTO);
  if (r != CXLKV_RESULT_OK) return fail("format", r);
  cxlkv_node *node = NULL;
  r = cxlkv_node_attach(region, NULL, &node);
  if (r != CXLKV_RESULT_OK) return fail("attach", r);

  /* The namespace and the key chain of a 32-token prompt (2 blocks). */
  cxlkv_namespace nsf = {"llama-3-8b", 0, 0, 0, 1, 0, 16, 0, NULL, 0};
  uint32_t ns = 0;
  r = cxlkv_namespace_register(node, &nsf, &ns);
  if (r != CXLKV_RESULT_OK) return fail("namespace", r);
  uint32_t tokens[32];
  for (uint32_t i = 0; i < 32; i++) tokens[i] = 1000 + i;
  cxlkv_key keys[2];
  size_t n = 0;
  r = cxlkv_chain_keys(NULL, tokens, 32, 16, keys, 2, &n);
  if (r != CXLKV_RESULT_OK) return fail("chain keys", r);

  /* Put block 0 from K and V buffers (copying). */
  char k[] = "K of block 0", v[] = "V of block 0";
  cxlkv_iovec parts[2] = {{k, sizeof k}, {v, sizeof v}};
  cxlkv_put_item item = {keys[0], 16, 0, parts, 2};
  cxlkv_result st;
  r = cxlkv_put(node, ns, &item, 1, &st);
  if (r != CXLKV_RESULT_OK || st != CXLKV_RESULT_OK) return fail("put", r != CXLKV_RESULT_OK ? r : st);

  /* Longest cached prefix, then read it in place. */
  size_t prefix = 0;
  r = cxlkv_lookup(node, ns, keys, 2, NULL, &prefix);
  if (r != CXLKV_RESULT_OK) return fail("lookup", r);
  cxlkv_block blocks[2];
  cxlkv_result status[2];
  r = cxlkv_acquire(node, ns, keys, prefix, blocks, status, NULL);
  if (r != CXLKV_RESULT_OK) return fail("acquire", r);
  for (size_t i = 0; i < prefix; i++)
    printf("block %zu: %llu bytes: \"%s\" + \"%s\"\n", i, (unsigned long long)blocks[i].len,
           (const char *)blocks[i].data, (const char *)blocks[i].data + sizeof k);
  r = cxlkv_release(node, blocks, prefix);
  if (r != CXLKV_RESULT_OK) return fail("release", r);
  printf("cached prefix: %zu of 2 blocks\n", prefix);

  r = cxlkv_node_detach(node);
  if (r != CXLKV_RESULT_OK) return fail("detach", r);
  cxlkv_region_close(region);
  unlink(path);
  return 0;
}

/* Tiny test helpers shared by the C tests of cxlkv. */
#ifndef CXLKV_TEST_CHECK_H
#define CXLKV_TEST_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#include "cxlkv.h"

static int checks_run;

/* Fails the test (exit 1) when `cond` is false. */
#define CHECK(cond)                                                          \
  do {                                                                       \
    checks_run++;                                                            \
    if (!(cond)) {                                                           \
      fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      exit(1);                                                               \
    }                                                                        \
  } while (0)

/* Fails the test when a call does not return `want`. */
#define EXPECT(call, want)                                                   \
  do {                                                                       \
    cxlkv_result r_ = (call);                                                \
    checks_run++;                                                            \
    if (r_ != (want)) {                                                      \
      char m_[256];                                                          \
      size_t n_ = 0;                                                         \
      cxlkv_last_error(m_, sizeof m_, &n_);                                  \
      fprintf(stderr, "%s:%d: %s returned %u (%s; last error: %s), want %u\n", \
              __FILE__, __LINE__, #call, (unsigned)r_,                       \
              cxlkv_result_str((uint32_t)r_), m_, (unsigned)(want));         \
      exit(1);                                                               \
    }                                                                        \
  } while (0)

#define OK(call) EXPECT(call, CXLKV_RESULT_OK)

#endif

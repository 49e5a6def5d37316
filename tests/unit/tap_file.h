/* Shared by the check suites that read a capture from disk: the core reads none (it is fed bytes), so the test
 * reads the file into memory and hands that over (tap_capture_open_mem, tap_replay_run_mem). */
#ifndef TAP_FILE_H
#define TAP_FILE_H

#include "amqptap/buf.h"

#include <check.h>
#include <stdio.h>

/* The whole file at path into b (initialised here; tap_buf_deinit after); fails the test when it cannot. */
static inline void tap_file_slurp(const char *path, struct tap_buf *b)
{
	tap_buf_init(b);
	FILE *f = fopen(path, "rb");
	ck_assert_msg(f != NULL, "%s: cannot open", path);
	char chunk[65536];
	size_t n;
	while ((n = fread(chunk, 1, sizeof chunk, f)) > 0)
		tap_buf_append(b, chunk, n);
	ck_assert_msg(!ferror(f) && !b->oom, "%s: cannot read", path);
	fclose(f);
}

#endif

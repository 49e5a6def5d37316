/* JSON Lines building blocks shared by every sink: a growable byte buffer,
 * a small JSON writer that tracks commas and escapes strings per RFC 8259
 * (bytes that are not valid UTF-8 are written as \u00XX, never raw), and a
 * buffered output file that is flushed in large writes and can be reopened
 * for logrotate. */
#ifndef AMQPTAP_JSONL_H
#define AMQPTAP_JSONL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

struct tap_buf {
	char *data;
	size_t len;
	size_t cap;
	bool oom; /* an append failed; contents are truncated */
};

void tap_buf_init(struct tap_buf *b);
void tap_buf_deinit(struct tap_buf *b);
void tap_buf_reset(struct tap_buf *b);
/* Makes room for extra more bytes; false (and oom set) if that failed. */
bool tap_buf_grow(struct tap_buf *b, size_t extra);
void tap_buf_puts(struct tap_buf *b, const char *s);
void tap_buf_printf(struct tap_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define TAP_JSON_MAX_DEPTH 64

/* Writes one JSON value into a tap_buf. Nesting deeper than
 * TAP_JSON_MAX_DEPTH is still written correctly; only comma tracking
 * beyond it falls back to "always comma after the first". */
struct tap_json {
	struct tap_buf *b;
	int depth;
	uint64_t first;     /* bit d set: no element written yet at depth d */
	bool after_key;     /* a key was just written, the value follows */
};

/* The hot small pieces are inline: every record is a few dozen of them, and
 * with the key names visible as literals their strlen folds away. */

static inline bool tap_buf_reserve(struct tap_buf *b, size_t extra)
{
	return (!b->oom && extra <= b->cap - b->len) || tap_buf_grow(b, extra);
}

static inline void tap_buf_append(struct tap_buf *b, const void *data, size_t len)
{
	if (len == 0 || !tap_buf_reserve(b, len))
		return;
	memcpy(b->data + b->len, data, len);
	b->len += len;
}

static inline void tap_buf_putc(struct tap_buf *b, char c)
{
	if (tap_buf_reserve(b, 1))
		b->data[b->len++] = c;
}

/* The comma before a value or key, unless it is the first in its object or
 * array, or the value right after its key. */
static inline void tap_json_sep(struct tap_json *j)
{
	if (j->after_key) {
		j->after_key = false;
		return;
	}
	if (j->depth < TAP_JSON_MAX_DEPTH) {
		uint64_t bit = UINT64_C(1) << j->depth;
		if (j->first & bit) {
			j->first &= ~bit;
			return;
		}
	}
	tap_buf_putc(j->b, ',');
}

/* key: one of the program's constant names (ASCII, no quotes, backslashes or
 * control bytes), written as is. Names from the wire go through tap_json_strn. */
static inline void tap_json_keyn(struct tap_json *j, const char *key, size_t n)
{
	tap_json_sep(j);
	if (tap_buf_reserve(j->b, n + 3)) {
		char *p = j->b->data + j->b->len;
		p[0] = '"';
		memcpy(p + 1, key, n);
		p[n + 1] = '"';
		p[n + 2] = ':';
		j->b->len += n + 3;
	}
	j->after_key = true;
}

static inline void tap_json_key(struct tap_json *j, const char *key)
{
	tap_json_keyn(j, key, strlen(key));
}

void tap_json_init(struct tap_json *j, struct tap_buf *b);
void tap_json_obj_begin(struct tap_json *j);
void tap_json_obj_end(struct tap_json *j);
void tap_json_arr_begin(struct tap_json *j);
void tap_json_arr_end(struct tap_json *j);
void tap_json_str(struct tap_json *j, const char *s);
void tap_json_strn(struct tap_json *j, const void *s, size_t len);
void tap_json_int(struct tap_json *j, int64_t v);
void tap_json_uint(struct tap_json *j, uint64_t v);
void tap_json_double(struct tap_json *j, double v);
void tap_json_bool(struct tap_json *j, bool v);
void tap_json_null(struct tap_json *j);
/* A string holding bytes as lowercase hex. */
void tap_json_hex(struct tap_json *j, const void *data, size_t len);
/* RFC 3339 UTC with microseconds: "2026-11-29T10:15:02.000412Z". */
void tap_json_ts(struct tap_json *j, int64_t unix_us);
/* A pre-rendered JSON value, copied verbatim. */
void tap_json_raw(struct tap_json *j, const char *json, size_t len);

/* key + value in one call */
static inline void tap_json_kv_str(struct tap_json *j, const char *key, const char *s)
{
	tap_json_key(j, key);
	tap_json_str(j, s);
}

static inline void tap_json_kv_strn(struct tap_json *j, const char *key, const void *s, size_t len)
{
	tap_json_key(j, key);
	tap_json_strn(j, s, len);
}

static inline void tap_json_kv_int(struct tap_json *j, const char *key, int64_t v)
{
	tap_json_key(j, key);
	tap_json_int(j, v);
}

static inline void tap_json_kv_uint(struct tap_json *j, const char *key, uint64_t v)
{
	tap_json_key(j, key);
	tap_json_uint(j, v);
}

static inline void tap_json_kv_bool(struct tap_json *j, const char *key, bool v)
{
	tap_json_key(j, key);
	tap_json_bool(j, v);
}

static inline void tap_json_kv_null(struct tap_json *j, const char *key)
{
	tap_json_key(j, key);
	tap_json_null(j);
}

static inline void tap_json_kv_ts(struct tap_json *j, const char *key, int64_t unix_us)
{
	tap_json_key(j, key);
	tap_json_ts(j, unix_us);
}

/* Appends the JSON string escape of len bytes to b (with the quotes). */
void tap_json_escape(struct tap_buf *b, const void *s, size_t len);

/* Writes the RFC 3339 form of unix_us (no quotes) into out[32]. */
void tap_format_ts(char out[32], int64_t unix_us);

/* A buffered line-oriented output file. "-" is stdout. Lines are collected
 * in memory and written with one write() per TAP_OUT_FLUSH_BYTES or per
 * tap_out_flush(); a line is never split across two files on reopen. */
#define TAP_OUT_FLUSH_BYTES (64 * 1024)

struct tap_out {
	char *path; /* NULL for stdout */
	int fd;
	struct tap_buf pending;
	uint64_t lines;
	uint64_t write_errors;
};

/* Returns 0 or a negative status; on failure errno tells why. */
int tap_out_open(struct tap_out *o, const char *path);
/* Appends one record (without its newline, which is added) and writes when
 * the buffer is large. */
void tap_out_line(struct tap_out *o, const char *data, size_t len);
/* Appends raw bytes (no newline, not counted as a line), written like lines; a binary record appended in one
 * call is never split across a flush. */
void tap_out_write(struct tap_out *o, const void *data, size_t len);
int tap_out_flush(struct tap_out *o);
/* Flushes, closes and opens the same path again (SIGHUP). stdout stays. */
int tap_out_reopen(struct tap_out *o);
void tap_out_close(struct tap_out *o);

#endif

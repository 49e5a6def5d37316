/* A small JSON writer into a tap_buf: tracks commas and escapes strings per RFC 8259 (bytes that are not valid
 * UTF-8 are written as \u00XX, never raw); timestamps in RFC 3339 UTC with microseconds. */
#ifndef AMQPTAP_JSON_H
#define AMQPTAP_JSON_H

#include "amqptap/buf.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

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

/* The hot small pieces are inline: with the key names visible as literals their strlen folds away. */

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
/* A writer that goes on inside an object whose opening brace and first members are already in b. */
void tap_json_init_in_object(struct tap_json *j, struct tap_buf *b);
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
/* Length of the valid UTF-8 sequence at s (1..4), or 0 if invalid (also for other escapers, e.g. metrics labels). */
size_t tap_json_utf8_len(const unsigned char *s, size_t avail);

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

/* Writers into space the caller reserved, for records built without the comma tracking above; each returns
 * the end of what it wrote. At most TAP_JSON_ESCAPED_MAX(len) bytes: */
#define TAP_JSON_ESCAPED_MAX(len) (6 * (size_t)(len) + 2)
char *tap_json_escape_at(char *dst, const void *s, size_t len);
/* At most TAP_JSON_NUMBER_MAX bytes: */
#define TAP_JSON_NUMBER_MAX 20u
char *tap_json_int_at(char *dst, int64_t v);
char *tap_json_uint_at(char *dst, uint64_t v);

/* Writes the RFC 3339 form of unix_us (no quotes) into out[32]. */
void tap_format_ts(char out[32], int64_t unix_us);

#endif

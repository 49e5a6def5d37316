/* The JSON writer and RFC 3339 timestamps. See include/amqptap/json.h. */
#include "amqptap/json.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

void tap_json_init(struct tap_json *j, struct tap_buf *b)
{
	memset(j, 0, sizeof *j);
	j->b = b;
	j->first = 1;
}

void tap_json_init_in_object(struct tap_json *j, struct tap_buf *b)
{
	tap_json_init(j, b);
	j->depth = 1;
	j->first = 0;
}

static void json_open(struct tap_json *j, char c)
{
	tap_json_sep(j);
	tap_buf_putc(j->b, c);
	j->depth++;
	if (j->depth < TAP_JSON_MAX_DEPTH)
		j->first |= UINT64_C(1) << j->depth;
}

static void json_close(struct tap_json *j, char c)
{
	if (j->depth > 0)
		j->depth--;
	tap_buf_putc(j->b, c);
}

void tap_json_obj_begin(struct tap_json *j) { json_open(j, '{'); }
void tap_json_obj_end(struct tap_json *j) { json_close(j, '}'); }
void tap_json_arr_begin(struct tap_json *j) { json_open(j, '['); }
void tap_json_arr_end(struct tap_json *j) { json_close(j, ']'); }

size_t tap_json_utf8_len(const unsigned char *s, size_t avail)
{
	unsigned char c = s[0];
	size_t n;
	uint32_t cp;
	if (c < 0x80)
		return 1;
	if (c >= 0xC2 && c <= 0xDF) {
		n = 2;
		cp = c & 0x1F;
	} else if (c >= 0xE0 && c <= 0xEF) {
		n = 3;
		cp = c & 0x0F;
	} else if (c >= 0xF0 && c <= 0xF4) {
		n = 4;
		cp = c & 0x07;
	} else {
		return 0;
	}
	if (avail < n)
		return 0;
	for (size_t i = 1; i < n; i++) {
		if ((s[i] & 0xC0) != 0x80)
			return 0;
		cp = (cp << 6) | (s[i] & 0x3F);
	}
	if ((n == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) || (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)))
		return 0;
	return n;
}

/* 1 for the bytes a JSON string holds as they are: printable ASCII but '"' and '\\'. */
static const unsigned char plain_ascii[256] = {
	[0x20] = 1, [0x21] = 1, [0x23 ... 0x5B] = 1, [0x5D ... 0x7E] = 1,
};

/* The bytes the character at s takes escaped; *n is set to its length in s (a whole UTF-8 sequence, or 1). */
static inline size_t escaped_width(const unsigned char *s, size_t avail, size_t *n)
{
	unsigned char c = s[0];
	*n = 1;
	if (plain_ascii[c])
		return 1;
	if (c >= 0x80 && (*n = tap_json_utf8_len(s, avail)) > 0)
		return *n;
	*n = 1;
	return c == '"' || c == '\\' || c == '\n' || c == '\r' || c == '\t' ? 2 : 6;
}

char *tap_json_escape_at(char *dst, const void *data, size_t len)
{
	static const char hex[] = "0123456789abcdef";
	const unsigned char *s = data;
	size_t i = 0;
	*dst++ = '"';
	while (i < len) {
		size_t run = i, n;
		while (i < len && plain_ascii[s[i]])
			i++;
		if (i > run) { /* an empty slice may have no pointer */
			memcpy(dst, s + run, i - run);
			dst += i - run;
		}
		if (i == len)
			break;
		if (escaped_width(s + i, len - i, &n) == n) { /* a whole UTF-8 sequence */
			memcpy(dst, s + i, n);
			dst += n;
			i += n;
			continue;
		}
		unsigned char c = s[i++];
		*dst++ = '\\';
		switch (c) {
		case '"':
		case '\\': *dst++ = (char)c; break;
		case '\n': *dst++ = 'n'; break;
		case '\r': *dst++ = 'r'; break;
		case '\t': *dst++ = 't'; break;
		default:
			memcpy(dst, "u00", 3);
			dst[3] = hex[c >> 4];
			dst[4] = hex[c & 15];
			dst += 5;
			break;
		}
	}
	*dst++ = '"';
	return dst;
}

void tap_json_escape(struct tap_buf *b, const void *data, size_t len)
{
	const unsigned char *s = data;
	size_t i = 0, need;
	while (i < len && plain_ascii[s[i]])
		i++;
	if (i == len && tap_buf_reserve(b, len + 2)) { /* the common case: one copy between the quotes */
		char *p = b->data + b->len;
		p[0] = '"';
		if (len) /* an empty slice may have no pointer */
			memcpy(p + 1, s, len);
		p[len + 1] = '"';
		b->len += len + 2;
		return;
	}
	for (need = i + 2; i < len;) { /* the exact size, so that a long string reserves no more than it takes */
		size_t n;
		need += escaped_width(s + i, len - i, &n);
		i += n;
	}
	if (tap_buf_reserve(b, need))
		b->len = (size_t)(tap_json_escape_at(b->data + b->len, s, len) - b->data);
}

void tap_json_str(struct tap_json *j, const char *s)
{
	if (!s) {
		tap_json_null(j);
		return;
	}
	tap_json_strn(j, s, strlen(s));
}

void tap_json_strn(struct tap_json *j, const void *s, size_t len)
{
	tap_json_sep(j);
	tap_json_escape(j->b, s, len);
}

/* Two decimal digits per value from 0 to 99: a number is written two digits a step, straight where it goes (a
 * record holds a dozen of them: seq, times, sizes, ids). */
static const char digit_pairs[200] = "0001020304050607080910111213141516171819202122232425262728293031323334353637383940414243444546474849"
				     "5051525354555657585960616263646566676869707172737475767778798081828384858687888990919293949596979899";

/* How many decimal digits v has. */
static unsigned decimal_len(uint64_t v)
{
	for (unsigned n = 1;; n += 4, v /= 10000) {
		if (v < 10)
			return n;
		if (v < 100)
			return n + 1;
		if (v < 1000)
			return n + 2;
		if (v < 10000)
			return n + 3;
	}
}

char *tap_json_uint_at(char *dst, uint64_t v)
{
	char *end = dst + decimal_len(v), *q = end;
	for (; v >= 100; v /= 100) {
		q -= 2;
		memcpy(q, digit_pairs + 2 * (v % 100), 2);
	}
	if (v >= 10)
		memcpy(q - 2, digit_pairs + 2 * v, 2);
	else
		q[-1] = (char)('0' + v);
	return end;
}

char *tap_json_int_at(char *dst, int64_t v)
{
	if (v >= 0)
		return tap_json_uint_at(dst, (uint64_t)v);
	*dst = '-';
	return tap_json_uint_at(dst + 1, 0 - (uint64_t)v);
}

void tap_json_int(struct tap_json *j, int64_t v)
{
	tap_json_sep(j);
	if (tap_buf_reserve(j->b, TAP_JSON_NUMBER_MAX))
		j->b->len = (size_t)(tap_json_int_at(j->b->data + j->b->len, v) - j->b->data);
}

void tap_json_uint(struct tap_json *j, uint64_t v)
{
	tap_json_sep(j);
	if (tap_buf_reserve(j->b, TAP_JSON_NUMBER_MAX))
		j->b->len = (size_t)(tap_json_uint_at(j->b->data + j->b->len, v) - j->b->data);
}

void tap_json_double(struct tap_json *j, double v)
{
	tap_json_sep(j);
	if (!isfinite(v)) { /* JSON has no NaN/Inf */
		tap_buf_puts(j->b, isnan(v) ? "\"NaN\"" : (v > 0 ? "\"Infinity\"" : "\"-Infinity\""));
		return;
	}
	tap_buf_printf(j->b, "%.17g", v);
}

void tap_json_bool(struct tap_json *j, bool v)
{
	tap_json_sep(j);
	tap_buf_puts(j->b, v ? "true" : "false");
}

void tap_json_null(struct tap_json *j)
{
	tap_json_sep(j);
	tap_buf_puts(j->b, "null");
}

void tap_json_hex(struct tap_json *j, const void *data, size_t len)
{
	static const char hex[] = "0123456789abcdef";
	const unsigned char *s = data;
	tap_json_sep(j);
	tap_buf_putc(j->b, '"');
	for (size_t i = 0; i < len; i++) {
		char pair[2] = {hex[s[i] >> 4], hex[s[i] & 15]};
		tap_buf_append(j->b, pair, 2);
	}
	tap_buf_putc(j->b, '"');
}

void tap_format_ts(char out[32], int64_t unix_us)
{
	int64_t secs = unix_us / 1000000;
	int64_t us = unix_us % 1000000;
	if (us < 0) {
		us += 1000000;
		secs--;
	}
	time_t t = (time_t)secs;
	struct tm tm;
	if (!gmtime_r(&t, &tm)) {
		snprintf(out, 32, "1970-01-01T00:00:00.000000Z");
		return;
	}
	/* tm fields are range-checked by gmtime_r; clamp the year so the
	 * compiler can see the result fits in 27 bytes. */
	int year = tm.tm_year + 1900;
	if (year < 0 || year > 9999)
		year = year < 0 ? 0 : 9999;
	snprintf(out, 32, "%04u-%02u-%02uT%02u:%02u:%02u.%06uZ", (unsigned)year, (unsigned)(tm.tm_mon + 1) % 100u,
		 (unsigned)tm.tm_mday % 100u, (unsigned)tm.tm_hour % 100u, (unsigned)tm.tm_min % 100u,
		 (unsigned)tm.tm_sec % 100u, (unsigned)us % 1000000u);
}

void tap_json_ts(struct tap_json *j, int64_t unix_us)
{
	char ts[32];
	tap_format_ts(ts, unix_us);
	tap_json_sep(j);
	tap_buf_putc(j->b, '"');
	tap_buf_puts(j->b, ts);
	tap_buf_putc(j->b, '"');
}

void tap_json_raw(struct tap_json *j, const char *json, size_t len)
{
	tap_json_sep(j);
	tap_buf_append(j->b, json, len);
}

/* The record header of include/amqptap/record.h: "type", "ts" with the date part formatted once per second, and
 * the run id quoted once per writer. */
#include "amqptap/record.h"

#include <stdio.h>

void tap_record_head_init(struct tap_record_head *h, const char *run)
{
	char cut[TAP_RECORD_RUN_MAX + 1];
	h->ts_sec = INT64_MIN;
	h->run_json_len = 0;
	if (!run || !run[0])
		return;
	(void)snprintf(cut, sizeof cut, "%s", run);
	h->run_json_len = (size_t)(tap_json_escape_at(h->run_json, cut, strlen(cut)) - h->run_json);
}

char *tap_record_ts_at(struct tap_record_head *h, char *p, int64_t unix_us)
{
	int64_t sec = unix_us / 1000000, us = unix_us % 1000000;
	if (us < 0) {
		us += 1000000;
		sec--;
	}
	if (sec != h->ts_sec) {
		tap_format_ts(h->ts_date, sec * 1000000);
		h->ts_sec = sec;
	}
	size_t len = strlen(h->ts_date);
	*p++ = '"';
	if (len != 27 || h->ts_date[19] != '.') {
		char ts[32];
		tap_format_ts(ts, unix_us);
		len = strlen(ts);
		memcpy(p, ts, len);
	} else {
		memcpy(p, h->ts_date, len);
		for (int i = 6; i > 0; i--) {
			p[19 + i] = (char)('0' + us % 10);
			us /= 10;
		}
	}
	p[len] = '"';
	return p + len + 1;
}

void tap_record_begin(struct tap_json *j, struct tap_buf *b, struct tap_record_head *h, const char *type,
                      int64_t unix_us)
{
	static const char lead[] = TAP_RECORD_OPEN_LEAD, trail[] = TAP_RECORD_OPEN_TRAIL;
	size_t type_len = strlen(type);
	tap_json_init_in_object(j, b);
	if (!tap_buf_reserve(b, TAP_RECORD_HEAD_MAX(type_len)))
		return;
	char *p = b->data + b->len;
	memcpy(p, lead, sizeof lead - 1);
	p += sizeof lead - 1;
	memcpy(p, type, type_len);
	p += type_len;
	memcpy(p, trail, sizeof trail - 1);
	p += sizeof trail - 1;
	b->len = (size_t)(tap_record_head_rest_at(h, p, unix_us) - b->data);
}

void tap_record_begin_once(struct tap_json *j, struct tap_buf *b, const char *type, int64_t unix_us,
                           const char *run)
{
	struct tap_record_head h;
	tap_record_head_init(&h, run);
	tap_record_begin(j, b, &h, type, unix_us);
}

/* The header every JSONL record opens with (src/DESIGN.md §4): {"type":..,"ts":..[,"run":..], the members that order
 * merged records and name the run that wrote them. The tracker's records, the observer's stream records, the
 * outputs' loss notes and the capture drop reports are all begun here. */
#ifndef AMQPTAP_RECORD_H
#define AMQPTAP_RECORD_H

#include "amqptap/buf.h"
#include "amqptap/json.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* The longest run id a record carries; a longer one is cut to it. */
#define TAP_RECORD_RUN_MAX 16u

/* What the records of one writer share: the run id, quoted once, and the date part of the last second a "ts" was
 * written for (records come in time order, a few per second share it). */
struct tap_record_head {
	char run_json[TAP_JSON_ESCAPED_MAX(TAP_RECORD_RUN_MAX)];
	size_t run_json_len; /* 0: records carry no "run" */
	int64_t ts_sec;      /* the second ts_date is of, INT64_MIN: none */
	char ts_date[32];
};

/* run NULL or "": the records carry no "run" member. */
void tap_record_head_init(struct tap_record_head *h, const char *run);

/* The most bytes tap_record_ts_at writes, and tap_record_head_at for a type of type_len bytes. */
#define TAP_RECORD_TS_MAX 34u
#define TAP_RECORD_HEAD_MAX(type_len)                                                                              \
	(sizeof "{\"type\":\"\",\"ts\":,\"run\":" + (size_t)(type_len) + TAP_RECORD_TS_MAX +                          \
	 TAP_JSON_ESCAPED_MAX(TAP_RECORD_RUN_MAX))

/* The quoted RFC 3339 form of unix_us (as tap_json_ts writes it) at p, which has TAP_RECORD_TS_MAX bytes of room;
 * returns its end. */
char *tap_record_ts_at(struct tap_record_head *h, char *p, int64_t unix_us);

/* The header's opening up to the value of "ts": the type goes between lead and trail; TAP_RECORD_OPEN for a type
 * known when the program is built. */
#define TAP_RECORD_OPEN_LEAD "{\"type\":\""
#define TAP_RECORD_OPEN_TRAIL "\",\"ts\":"
#define TAP_RECORD_OPEN(type) TAP_RECORD_OPEN_LEAD type TAP_RECORD_OPEN_TRAIL

/* The header's "ts" value and its "run" member at p. */
static inline char *tap_record_head_rest_at(struct tap_record_head *h, char *p, int64_t unix_us)
{
	p = tap_record_ts_at(h, p, unix_us);
	if (h->run_json_len) {
		memcpy(p, ",\"run\":", sizeof ",\"run\":" - 1);
		p += sizeof ",\"run\":" - 1;
		memcpy(p, h->run_json, h->run_json_len);
		p += h->run_json_len;
	}
	return p;
}

/* {"type":"<type>","ts":<ts>[,"run":<run>] at p, into room the caller reserved (TAP_RECORD_HEAD_MAX), for a
 * record whose type is a literal: TAP_RECORD_HEAD_AT(h, p, "publish", now_us). Returns the end. Written in one
 * copy and inline: the publish record, most of what the tap writes, is begun with it. */
#define TAP_RECORD_HEAD_AT(h, p, type, unix_us)                                                                    \
	tap_record_head_rest_at((h), (char *)memcpy((p), TAP_RECORD_OPEN(type), sizeof TAP_RECORD_OPEN(type) - 1) +    \
	                                 sizeof TAP_RECORD_OPEN(type) - 1,                                             \
	                        (unix_us))

/* Appends the header of a record of this type to b; j then writes the record's other members and closes it with
 * tap_json_obj_end. On no memory b is marked oom, as by any other write. */
void tap_record_begin(struct tap_json *j, struct tap_buf *b, struct tap_record_head *h, const char *type,
                      int64_t unix_us);
/* The same for a record whose writer keeps no head: run as tap_record_head_init takes it. */
void tap_record_begin_once(struct tap_json *j, struct tap_buf *b, const char *type, int64_t unix_us,
                           const char *run);

#endif

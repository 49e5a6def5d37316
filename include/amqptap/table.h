/* AMQP field tables and arrays with RabbitMQ's type letters (PROTOCOL.md §12, rabbit_binary_parser.erl):
 * a bounded, allocation-free validator, an iterator for callers that need one key, and a JSON writer.
 * All functions take the table body WITHOUT its u32 length prefix (what tap_method_decode returns). */
#ifndef AMQPTAP_TABLE_H
#define AMQPTAP_TABLE_H

#include "amqptap/jsonl.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The outermost table is depth 1; a table or array inside it is depth 2, and so on. Each level costs two
 * JSON levels in tap_table_to_json, and a frame-trace line puts the outermost table at JSON depth 3, so 24
 * keeps every line within TAP_JSON_MAX_DEPTH (64). */
#define TAP_TABLE_MAX_DEPTH 24

/* 0 if p[0..len) is a well-formed table; TAP_E_TRUNCATED, TAP_E_BAD_FIELD_TYPE or TAP_E_TABLE_TOO_DEEP.
 * Iterative: no recursion and no allocation whatever the input. */
int tap_table_validate(const uint8_t *p, size_t len);
/* The same for the body of an 'A' field array. */
int tap_array_validate(const uint8_t *p, size_t len);

/* One field. Integers (b B s u I i l L T t) are in i (signed kinds sign-extended) and u (the raw unsigned
 * bits); f and d in f; D in scale + i (the signed 32-bit value); S, x, F, A as a slice (F/A: the nested
 * body without its length prefix). V has nothing. */
struct tap_field {
	const uint8_t *name; /* NULL inside arrays */
	uint8_t name_len;
	char type; /* the wire type letter */
	int64_t i;
	uint64_t u;
	double f;
	uint8_t scale;
	const uint8_t *ptr;
	uint32_t len;
};

struct tap_table_it {
	const uint8_t *p, *end;
	bool array;
};

void tap_table_it_init(struct tap_table_it *it, const uint8_t *p, size_t len);
void tap_array_it_init(struct tap_table_it *it, const uint8_t *p, size_t len);
/* 1 and fills f, 0 at the end, or a negative status (the iterator then stays at the bad field). Nested
 * tables and arrays are returned as slices, not validated: validate first when the input is untrusted. */
int tap_table_next(struct tap_table_it *it, struct tap_field *f);
/* Finds the first field called name in a table and fills f; false if absent or the table is malformed before it,
 * and then f is all zero (type 0, ptr NULL): nothing of another field is left in it. */
bool tap_table_find(const uint8_t *p, size_t len, const char *name, struct tap_field *f);

/* Writes the table as a JSON object in which every value is a one-key object naming its type letter:
 *   {"x-max-length":{"l":1},"x-overflow":{"S":"reject-publish"},"flag":{"t":true},"n":{"V":null},
 *    "args":{"A":[{"I":1},{"S":"a"}]},"nested":{"F":{"k":{"b":-1}}},"price":{"D":{"scale":2,"value":1999}},
 *    "raw":{"x":"00ff"},"ts":{"T":1700000000},"pi":{"d":3.14}}
 * S is a JSON string (invalid UTF-8 escaped as \u00XX), x is lowercase hex. The input is validated first:
 * on a malformed table it writes null and returns the status; otherwise 0. */
int tap_table_to_json(struct tap_json *j, const uint8_t *p, size_t len);
/* The same for the body of an 'A' field array: a JSON array of one-key objects. */
int tap_array_to_json(struct tap_json *j, const uint8_t *p, size_t len);

#endif

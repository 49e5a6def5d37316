/* Field tables and arrays, RabbitMQ flavour (PROTOCOL.md §12; 0-9-1 §4.2.5.5 and the errata's third
 * column): validation with an explicit depth stack, an iterator, and the JSON form of table.h. */
#include "amqptap/table.h"

#include "amqptap/status.h"
#include "rd.h"

#include <string.h>

/* Fixed-width value sizes by type letter; 0 for variable or unknown letters. */
static uint8_t fixed_size(uint8_t t)
{
	switch (t) {
	case 't': case 'b': case 'B': return 1;
	case 's': case 'u': return 2;
	case 'I': case 'i': case 'f': return 4;
	case 'D': return 5;
	case 'l': case 'L': case 'd': case 'T': return 8;
	default: return 0;
	}
}

static int container_validate(const uint8_t *p, size_t len, bool array)
{
	struct level {
		const uint8_t *end;
		bool array;
	} stack[TAP_TABLE_MAX_DEPTH];
	int depth = 0;
	struct tap_rd r;
	tap_rd_init(&r, p, len);
	stack[0].end = r.end;
	stack[0].array = array;
	for (;;) {
		if (r.p == stack[depth].end) {
			if (depth == 0)
				return TAP_OK;
			depth--;
			continue;
		}
		struct tap_rd c = {r.p, stack[depth].end};
		const uint8_t *s;
		uint32_t n;
		uint8_t t;
		if (!stack[depth].array && !tap_rd_shortstr(&c, &s, &n))
			return TAP_E_TRUNCATED;
		if (!tap_rd_u8(&c, &t))
			return TAP_E_TRUNCATED;
		uint8_t fs = fixed_size(t);
		if (fs) {
			if (!tap_rd_bytes(&c, fs, &s))
				return TAP_E_TRUNCATED;
		} else if (t == 'V') {
		} else if (t == 'S' || t == 'x' || t == 'F' || t == 'A') {
			if (!tap_rd_longstr(&c, &s, &n))
				return TAP_E_TRUNCATED;
			if (t == 'F' || t == 'A') {
				if (depth + 1 >= TAP_TABLE_MAX_DEPTH)
					return TAP_E_TABLE_TOO_DEEP;
				r.p = s; /* descend; the parent resumes at c.p == s + n */
				depth++;
				stack[depth].end = s + n;
				stack[depth].array = t == 'A';
				continue;
			}
		} else {
			return TAP_E_BAD_FIELD_TYPE;
		}
		r.p = c.p;
	}
}

int tap_table_validate(const uint8_t *p, size_t len)
{
	return container_validate(p, len, false);
}

int tap_array_validate(const uint8_t *p, size_t len)
{
	return container_validate(p, len, true);
}

void tap_table_it_init(struct tap_table_it *it, const uint8_t *p, size_t len)
{
	it->p = p;
	it->end = p + len;
	it->array = false;
}

void tap_array_it_init(struct tap_table_it *it, const uint8_t *p, size_t len)
{
	tap_table_it_init(it, p, len);
	it->array = true;
}

int tap_table_next(struct tap_table_it *it, struct tap_field *f)
{
	if (it->p == it->end)
		return 0;
	struct tap_rd c = {it->p, it->end};
	const uint8_t *s = NULL, *v;
	uint32_t n = 0;
	uint8_t t;
	if (!it->array && !tap_rd_shortstr(&c, &s, &n))
		return TAP_E_TRUNCATED;
	f->name = s;
	f->name_len = (uint8_t)n;
	if (!tap_rd_u8(&c, &t))
		return TAP_E_TRUNCATED;
	f->type = (char)t;
	f->i = 0;
	f->u = 0;
	f->f = 0;
	f->scale = 0;
	f->ptr = NULL;
	f->len = 0;
	uint8_t fs = fixed_size(t);
	if (fs) {
		if (!tap_rd_bytes(&c, fs, &v))
			return TAP_E_TRUNCATED;
		switch (t) {
		case 't': f->u = v[0]; f->i = v[0] != 0; break;
		case 'b': f->u = v[0]; f->i = (int8_t)v[0]; break;
		case 'B': f->u = f->i = v[0]; break;
		case 's': f->u = tap_be16(v); f->i = (int16_t)tap_be16(v); break;
		case 'u': f->u = f->i = tap_be16(v); break;
		case 'I': f->u = tap_be32(v); f->i = (int32_t)tap_be32(v); break;
		case 'i': f->u = f->i = tap_be32(v); break;
		case 'l': case 'L': case 'T': f->u = tap_be64(v); f->i = (int64_t)f->u; break;
		case 'f': {
			uint32_t bits = tap_be32(v);
			float x;
			memcpy(&x, &bits, sizeof x);
			f->u = bits;
			f->f = x;
			break;
		}
		case 'd': {
			uint64_t bits = tap_be64(v);
			memcpy(&f->f, &bits, sizeof f->f);
			f->u = bits;
			break;
		}
		case 'D':
			f->scale = v[0];
			f->u = tap_be32(v + 1);
			f->i = (int32_t)tap_be32(v + 1);
			break;
		}
	} else if (t == 'S' || t == 'x' || t == 'F' || t == 'A') {
		if (!tap_rd_longstr(&c, &f->ptr, &f->len))
			return TAP_E_TRUNCATED;
	} else if (t != 'V') {
		return TAP_E_BAD_FIELD_TYPE;
	}
	it->p = c.p;
	return 1;
}

bool tap_table_find(const uint8_t *p, size_t len, const char *name, struct tap_field *f)
{
	size_t nl = strlen(name);
	struct tap_table_it it;
	struct tap_field cur;
	tap_table_it_init(&it, p, len);
	while (tap_table_next(&it, &cur) == 1) {
		if (cur.name_len == nl && memcmp(cur.name, name, nl) == 0) {
			*f = cur;
			return true;
		}
	}
	memset(f, 0, sizeof *f);
	return false;
}

/* Input already validated, so recursion depth is bounded by TAP_TABLE_MAX_DEPTH. */
static void container_json(struct tap_json *j, const uint8_t *p, size_t len, bool array)
{
	struct tap_table_it it;
	struct tap_field f;
	tap_table_it_init(&it, p, len);
	it.array = array;
	if (array)
		tap_json_arr_begin(j);
	else
		tap_json_obj_begin(j);
	while (tap_table_next(&it, &f) == 1) {
		char letter[2] = {f.type, 0};
		if (!array) {
			/* names are bytes: escape them like values */
			tap_json_strn(j, f.name, f.name_len);
			tap_buf_putc(j->b, ':');
			j->after_key = true;
		}
		tap_json_obj_begin(j);
		tap_json_key(j, letter);
		switch (f.type) {
		case 't': tap_json_bool(j, f.i != 0); break;
		case 'b': case 's': case 'I': case 'l': case 'L': tap_json_int(j, f.i); break;
		case 'B': case 'u': case 'i': case 'T': tap_json_uint(j, f.u); break;
		case 'f': case 'd': tap_json_double(j, f.f); break;
		case 'D':
			tap_json_obj_begin(j);
			tap_json_kv_uint(j, "scale", f.scale);
			tap_json_kv_int(j, "value", f.i);
			tap_json_obj_end(j);
			break;
		case 'S': tap_json_strn(j, f.ptr, f.len); break;
		case 'x': tap_json_hex(j, f.ptr, f.len); break;
		case 'F': container_json(j, f.ptr, f.len, false); break;
		case 'A': container_json(j, f.ptr, f.len, true); break;
		default: tap_json_null(j); break;
		}
		tap_json_obj_end(j);
	}
	if (array)
		tap_json_arr_end(j);
	else
		tap_json_obj_end(j);
}

int tap_table_to_json(struct tap_json *j, const uint8_t *p, size_t len)
{
	int rc = tap_table_validate(p, len);
	if (rc < 0) {
		tap_json_null(j);
		return rc;
	}
	container_json(j, p, len, false);
	return TAP_OK;
}

int tap_array_to_json(struct tap_json *j, const uint8_t *p, size_t len)
{
	int rc = tap_array_validate(p, len);
	if (rc < 0) {
		tap_json_null(j);
		return rc;
	}
	container_json(j, p, len, true);
	return TAP_OK;
}

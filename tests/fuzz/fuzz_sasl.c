/* libFuzzer harness for tap_sasl_parse: the first byte picks PLAIN, AMQPLAIN or another mechanism, the rest is the
 * response. The secret ranges must be in order, inside the response and apart from the user (but for a last range
 * stretched to the end); every byte after PLAIN's second NUL, and the value of every AMQPLAIN PASSWORD string
 * before a malformed field, must be covered. Seeds: tests/fuzz/corpus/sasl/. */
#include "amqptap/sasl.h"
#include "amqptap/table.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static bool covered(const struct tap_sasl *a, size_t off, size_t len)
{
	for (size_t i = off; i < off + len; i++) {
		bool in = false;
		for (size_t k = 0; k < a->n_secrets && !in; k++)
			in = i >= a->secret[k].off && i < a->secret[k].off + a->secret[k].len;
		if (!in)
			return false;
	}
	return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const char *const mechs[] = {"PLAIN", "AMQPLAIN", "EXTERNAL"};
	if (size < 1)
		return 0;
	const char *mech = mechs[data[0] % 3];
	const uint8_t *r = data + 1;
	size_t n = size - 1;
	struct tap_sasl a;
	tap_sasl_parse((struct tap_slice){(const uint8_t *)mech, strlen(mech)}, (struct tap_slice){r, n}, &a);
	if (a.n_secrets > TAP_SASL_MAX_SECRETS)
		abort();
	size_t end = 0;
	for (size_t k = 0; k < a.n_secrets; k++) {
		if (a.secret[k].off < end || a.secret[k].len == 0 || a.secret[k].off + a.secret[k].len > n)
			abort();
		end = a.secret[k].off + a.secret[k].len;
	}
	if (a.user.len) {
		if (a.user.len > TAP_SASL_USER_MAX || a.user.ptr < r || a.user.ptr + a.user.len > r + n)
			abort();
		/* only the last range, stretched to the end when the ranges ran out, may also cover a later LOGIN */
		size_t real = a.n_secrets == TAP_SASL_MAX_SECRETS ? a.n_secrets - 1 : a.n_secrets;
		for (size_t k = 0; k < real; k++) {
			size_t u = (size_t)(a.user.ptr - r);
			if (u < a.secret[k].off + a.secret[k].len && a.secret[k].off < u + a.user.len)
				abort();
		}
	}
	if (data[0] % 3 == 0) {
		const uint8_t *nul1 = memchr(r, 0, n);
		const uint8_t *nul2 = nul1 ? memchr(nul1 + 1, 0, n - (size_t)(nul1 + 1 - r)) : NULL;
		size_t from = nul2 ? (size_t)(nul2 + 1 - r) : 0;
		if (!covered(&a, from, n - from))
			abort();
	} else if (data[0] % 3 == 1) {
		struct tap_table_it it;
		struct tap_field f;
		tap_table_it_init(&it, r, n);
		while (tap_table_next(&it, &f) == 1)
			if (f.name_len == 8 && memcmp(f.name, "PASSWORD", 8) == 0 && f.ptr &&
			    !covered(&a, (size_t)(f.ptr - r), f.len))
				abort();
	} else if (n > 0 && !covered(&a, 0, n)) {
		abort();
	}
	return 0;
}

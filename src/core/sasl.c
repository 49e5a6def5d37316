/* SASL start-ok responses: PLAIN (RFC 4616 §2) and AMQPLAIN (RabbitMQ's field-table mechanism); see sasl.h. */
#include "amqptap/sasl.h"

#include "amqptap/table.h"

#include <stdbool.h>
#include <string.h>
#include <strings.h>

static bool slice_is(struct tap_slice s, const char *text)
{
	return s.len == strlen(text) && memcmp(s.ptr, text, s.len) == 0;
}

static struct tap_slice user_slice(const uint8_t *p, size_t len)
{
	return (struct tap_slice){p, len > TAP_SASL_USER_MAX ? TAP_SASL_USER_MAX : len};
}

/* Adds [off, off + len); when the ranges are all used the last one is stretched to the end of the response. */
static void add_secret(struct tap_sasl *out, size_t off, size_t len, size_t resp_len)
{
	if (len == 0)
		return;
	if (out->n_secrets == TAP_SASL_MAX_SECRETS) {
		struct tap_sasl_range *last = &out->secret[TAP_SASL_MAX_SECRETS - 1];
		last->len = resp_len - last->off;
		return;
	}
	out->secret[out->n_secrets++] = (struct tap_sasl_range){off, len};
}

static void parse_plain(struct tap_slice r, struct tap_sasl *out)
{
	const uint8_t *nul1 = memchr(r.ptr, 0, r.len);
	const uint8_t *user = nul1 ? nul1 + 1 : NULL;
	const uint8_t *nul2 = user ? memchr(user, 0, r.len - (size_t)(user - r.ptr)) : NULL;
	if (!nul2) {
		add_secret(out, 0, r.len, r.len);
		return;
	}
	if (nul2 > user) {
		out->user = user_slice(user, (size_t)(nul2 - user));
		out->kept = (struct tap_sasl_range){(size_t)(nul1 - r.ptr), (size_t)(nul2 - nul1) + 1};
	}
	size_t pass = (size_t)(nul2 + 1 - r.ptr);
	add_secret(out, pass, r.len - pass, r.len);
}

static void parse_amqplain(struct tap_slice r, struct tap_sasl *out)
{
	struct tap_table_it it;
	struct tap_field f;
	bool login_seen = false;
	tap_table_it_init(&it, r.ptr, r.len);
	for (;;) {
		const uint8_t *start = it.p;
		int rc = tap_table_next(&it, &f);
		if (rc == 0)
			return;
		if (rc < 0) { /* cannot tell where its value ends: hide everything from here */
			add_secret(out, (size_t)(start - r.ptr), r.len - (size_t)(start - r.ptr), r.len);
			return;
		}
		bool string = f.type == 'S' || f.type == 'x';
		if (f.name_len == 5 && memcmp(f.name, "LOGIN", 5) == 0 && !login_seen) {
			login_seen = true;
			if (string) {
				out->user = user_slice(f.ptr, f.len);
				out->kept = (struct tap_sasl_range){(size_t)(start - r.ptr), (size_t)(it.p - start)};
			}
		} else if (f.name_len == 8 && strncasecmp((const char *)f.name, "PASSWORD", 8) == 0) {
			const uint8_t *v = f.ptr ? f.ptr : f.name + f.name_len + 1; /* after the type letter */
			size_t len = f.ptr ? f.len : (size_t)(it.p - v);
			add_secret(out, (size_t)(v - r.ptr), len, r.len);
		}
	}
}

bool tap_sasl_mechanism_known(struct tap_slice mechanism)
{
	static const char *const known[] = {"PLAIN",       "AMQPLAIN",      "EXTERNAL",      "ANONYMOUS",
	                                    "SCRAM-SHA-1", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER",
	                                    "XOAUTH2",     "GSSAPI",        "CRAM-MD5",      "RABBIT-CR-DEMO"};
	for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
		if (slice_is(mechanism, known[i]))
			return true;
	return false;
}

void tap_sasl_parse(struct tap_slice mechanism, struct tap_slice response, struct tap_sasl *out)
{
	memset(out, 0, sizeof *out);
	if (!response.ptr || response.len == 0)
		return;
	if (slice_is(mechanism, "PLAIN"))
		parse_plain(response, out);
	else if (slice_is(mechanism, "AMQPLAIN"))
		parse_amqplain(response, out);
	else
		add_secret(out, 0, response.len, response.len);
}

/* Which method arguments carry secrets (src/DESIGN.md §5): connection.start-ok and
 * secure-ok `response`, connection.update-secret `new-secret`, and a start-ok
 * `mechanism` that is no known mechanism's name; and where their bytes lie, so
 * a copy of the stream (the pcapng capture) can overwrite them without changing
 * any length. */
#ifndef AMQPTAP_REDACT_H
#define AMQPTAP_REDACT_H

#include "amqptap/sasl.h"
#include "amqptap/spec.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The filler written over secret bytes in a stream copy. */
#define TAP_REDACT_FILL '*'
#define TAP_REDACT_MAX_RANGES 3 /* a start-ok's unknown mechanism, and before and after the user it keeps */

/* True if argument `arg` of the decoded method m is a secret. */
bool tap_redact_is_secret(const struct tap_method *m, unsigned arg);

struct tap_range {
	size_t off; /* from the start of the method payload */
	size_t len;
};

/* The secret byte ranges of a decoded method whose payload starts at `payload` (the buffer given to
 * tap_method_decode), in order: for start-ok all of the response but tap_sasl_parse's kept bytes (the user, as the
 * frame trace shows it, with what finds it: PLAIN "\0user\0", AMQPLAIN the LOGIN field), so an authzid, every
 * other AMQPLAIN key and any other mechanism's response are hidden whole, and so is a mechanism
 * tap_sasl_mechanism_known does not know; for the other secret arguments the whole
 * argument. Returns how many ranges were written to out: 0 for a method without a secret or an empty one. */
size_t tap_redact_ranges(const struct tap_method *m, const uint8_t *payload, struct tap_range out[TAP_REDACT_MAX_RANGES]);

#endif

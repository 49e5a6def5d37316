/* Which method arguments carry secrets (DESIGN §5): connection.start-ok and
 * secure-ok `response`, connection.update-secret `new-secret`; and where the
 * secret bytes lie inside them, so a copy of the stream (the pcapng capture)
 * can overwrite them without changing any length. */
#ifndef AMQPTAP_REDACT_H
#define AMQPTAP_REDACT_H

#include "amqptap/sasl.h"
#include "amqptap/spec.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The filler written over secret bytes in a stream copy. */
#define TAP_REDACT_FILL '*'
#define TAP_REDACT_MAX_RANGES TAP_SASL_MAX_SECRETS

/* True if argument `arg` of method `method_id` (TAP_METHOD_ID) is a secret. */
bool tap_redact_is_secret(uint32_t method_id, unsigned arg);

struct tap_range {
	size_t off; /* from the start of the method payload */
	size_t len;
};

/* The secret byte ranges of a decoded method whose payload starts at `payload` (the buffer given to
 * tap_method_decode), in order: for start-ok those of tap_sasl_parse (PLAIN keeps "\0user\0" and covers the
 * password; AMQPLAIN covers every PASSWORD value), for the other secret arguments the whole argument. Returns
 * how many ranges were written to out. */
size_t tap_redact_ranges(const struct tap_method *m, const uint8_t *payload, struct tap_range out[TAP_REDACT_MAX_RANGES]);

#endif

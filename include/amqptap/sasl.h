/* The SASL response of connection.start-ok (0-9-1 §1.4.2.2; RabbitMQ's PLAIN and AMQPLAIN mechanisms), parsed
 * once for everything that needs it: the user name the records show, the password bytes it must never include,
 * and the bytes around the user a copy of the stream keeps (redact.h hides all the rest). */
#ifndef AMQPTAP_SASL_H
#define AMQPTAP_SASL_H

#include "amqptap/props.h" /* struct tap_slice */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TAP_SASL_MAX_SECRETS 4
#define TAP_SASL_USER_MAX 255 /* longer user names are cut to this many bytes */

/* Secret bytes, from the start of the response. */
struct tap_sasl_range {
	size_t off;
	size_t len;
};

struct tap_sasl {
	struct tap_slice user; /* a slice of the response; len 0 when there is none. Never a password byte. */
	/* The bytes a copy of the stream keeps so that a reader finds the user as this parser does: PLAIN from the
	 * NUL before the user through the NUL after it, AMQPLAIN the whole LOGIN field (name, type, length, value).
	 * Len 0 when there is no user: nothing is kept. */
	struct tap_sasl_range kept;
	struct tap_sasl_range secret[TAP_SASL_MAX_SECRETS]; /* in order, not overlapping */
	size_t n_secrets;
};

/* PLAIN, RFC 4616 "[authzid] NUL authcid NUL passwd": user authcid, secret passwd.
 * AMQPLAIN, a field table without its length prefix (rabbit_auth_mechanism_amqplain): user the first LOGIN key
 * when it is a string (S or x); secret the value of every PASSWORD key (compared without case, whatever its
 * type; S and x without their length, so the table still parses); a malformed field makes the rest of the
 * response secret, and so does a PASSWORD beyond the last range that fits.
 * Any other mechanism, or a PLAIN response without its two NULs: the whole response is secret, no user.
 * An empty response has no secret. */
void tap_sasl_parse(struct tap_slice mechanism, struct tap_slice response, struct tap_sasl *out);

/* True for the name of a SASL mechanism that clients and RabbitMQ's plugins use (PLAIN, AMQPLAIN, EXTERNAL,
 * SCRAM-SHA-*, ...). Any other start-ok `mechanism` is shown nowhere: a client can put anything there, its password
 * included, and no broker would accept it anyway. */
bool tap_sasl_mechanism_known(struct tap_slice mechanism);

#endif

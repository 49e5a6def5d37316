/* Method payloads per protocol version: 0-9-1 as spec.h defines it, and AMQP 0-8 as RabbitMQ speaks it
 * (rabbit_framing_amqp_0_8, generated from its amqp-rabbitmq-0.8.json). 0-8 methods laid out as in 0-9-1 map onto
 * the 0-9-1 definitions, so the tracker acts on them unchanged; the few that differ have definitions here. */
#ifndef AMQPTAP_DIALECT_H
#define AMQPTAP_DIALECT_H

#include "amqptap/frame.h"
#include "amqptap/spec.h"

#include <stddef.h>
#include <stdint.h>

/* The ids of 0-8 definitions that have no 0-9-1 twin: never equal to a 0-9-1 TAP_METHOD_ID. */
#define TAP_METHOD_ID_0_8(c, m) (TAP_METHOD_ID(c, m) | 0x80000000u)

enum {
	TAP_0_8_CONNECTION_REDIRECT = TAP_METHOD_ID_0_8(10, 50),
	TAP_0_8_CHANNEL_OPEN_OK = TAP_METHOD_ID_0_8(20, 11), /* no arguments in 0-8 */
	TAP_0_8_CHANNEL_ALERT = TAP_METHOD_ID_0_8(20, 30),
	TAP_0_8_ACCESS_REQUEST = TAP_METHOD_ID_0_8(30, 10),
	TAP_0_8_ACCESS_REQUEST_OK = TAP_METHOD_ID_0_8(30, 11),
	TAP_0_8_BASIC_CONSUME = TAP_METHOD_ID_0_8(60, 20), /* no arguments table in 0-8 */
};

/* The definition of (class_id, method_id) in version v; NULL if v has no such method. In 0-8 connection.close
 * is 10/60 and close-ok 10/61 (the 0-9-1 definitions are returned); 0-8 has no confirm class, no basic.nack, no
 * exchange.bind/unbind and no connection.blocked/unblocked/update-secret. */
const struct tap_method_def *tap_dialect_method(enum tap_amqp_version v, uint16_t class_id, uint16_t method_id);

/* tap_method_decode for version v: the same contract (m->class_id/method_id are the ids on the wire, m->def the
 * definition whose arguments were decoded). */
int tap_dialect_method_decode(enum tap_amqp_version v, const uint8_t *payload, size_t len, struct tap_method *m);

#endif

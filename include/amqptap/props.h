/* Content header frames (0-9-1 §4.2.6.1): class-id, weight, body-size, property flags with continuation
 * bit, then the 14 basic properties in flag order (amqp0-9-1 XML, class basic <field>s). Decoding
 * borrows from the payload: slices live as long as the payload does. */
#ifndef AMQPTAP_PROPS_H
#define AMQPTAP_PROPS_H

#include <stddef.h>
#include <stdint.h>

#ifndef TAP_SLICE_DEFINED
#define TAP_SLICE_DEFINED
struct tap_slice {
	const uint8_t *ptr;
	size_t len;
};
#endif

/* Presence bits of the first property-flags word: property n (0-based, XML order) is bit 15-n. */
enum {
	TAP_PROP_CONTENT_TYPE = 1u << 15,
	TAP_PROP_CONTENT_ENCODING = 1u << 14,
	TAP_PROP_HEADERS = 1u << 13,
	TAP_PROP_DELIVERY_MODE = 1u << 12,
	TAP_PROP_PRIORITY = 1u << 11,
	TAP_PROP_CORRELATION_ID = 1u << 10,
	TAP_PROP_REPLY_TO = 1u << 9,
	TAP_PROP_EXPIRATION = 1u << 8,
	TAP_PROP_MESSAGE_ID = 1u << 7,
	TAP_PROP_TIMESTAMP = 1u << 6,
	TAP_PROP_TYPE = 1u << 5,
	TAP_PROP_USER_ID = 1u << 4,
	TAP_PROP_APP_ID = 1u << 3,
	TAP_PROP_CLUSTER_ID = 1u << 2, /* "reserved" in 0-9-1 */
	TAP_PROP_CONTINUATION = 1u << 0,
};

/* The smallest content header payload: class-id, weight, body-size, one flags word. */
#define TAP_PROPS_MIN_SIZE 14

struct tap_props {
	uint16_t class_id;
	uint16_t weight;
	uint64_t body_size;
	uint16_t flags; /* presence bits, TAP_PROP_*, continuation bit cleared */
	struct tap_slice content_type, content_encoding, headers /* raw table without its length prefix */,
		correlation_id, reply_to, expiration, message_id, type, user_id, app_id, cluster_id;
	uint8_t delivery_mode, priority;
	uint64_t timestamp;
};

/* 0, or TAP_E_TRUNCATED (payload shorter than its flags say), TAP_E_UNKNOWN_CLASS (class other than basic;
 * class_id and body_size are still filled in), TAP_E_BAD_PROPERTY_FLAGS (a flag with no property), or a
 * table error for `headers`. Absent properties are zero/empty. */
int tap_props_decode(const uint8_t *payload, size_t len, struct tap_props *p);

#endif

/* RabbitMQ's definitions JSON (`rabbitmqctl export_definitions`, GET /api/definitions, or one vhost's
 * /api/definitions/VHOST without "vhost" members) into a routing model (route.h). Parsed with jansson: small,
 * packaged by Debian (libjansson-dev), a strict RFC 8259 parser; our own limits bound what it may take (the input's
 * size, its nesting, checked before jansson sees it, and the bytes jansson allocates), and the model's limits the
 * rest. A file that fails anywhere gives no model: the caller keeps the one it had. Pure: the bytes come in memory. */
#ifndef AMQPTAP_ROUTE_DEFS_H
#define AMQPTAP_ROUTE_DEFS_H

#include "amqptap/route.h"

#include <jansson.h>
#include <stddef.h>

struct tap_route_defs_limits {
	size_t max_input;   /* bytes of JSON */
	uint32_t max_depth; /* nesting of JSON arrays and objects */
	size_t max_parse;   /* bytes jansson may allocate for the tree */
	struct tap_route_limits model;
};

void tap_route_defs_limits_default(struct tap_route_defs_limits *l);

/* Builds a finished model from the JSON in data[0..len). vhost is the vhost of items without one (a single vhost's
 * export); NULL: "/". Returns 0 and *out, or a negative status with one line in err (what and where: "bindings[3]:
 * binding to queue 'q', which is not declared") and *out untouched. NULL limits: the defaults. */
int tap_route_defs_load(const char *data, size_t len, const char *vhost, const struct tap_route_defs_limits *limits,
                        struct tap_route_model **out, char *err, size_t err_cap);

/* JSON values as header or argument values (integers 'l', other numbers 'd', strings 'S', true/false 't', arrays
 * 'A', objects 'F' with their keys sorted; null is void 'V' when allow_null, else an error). The fields and values
 * live in *hold, freed with tap_route_json_free. Returns 0 or a negative status with err. */
struct tap_route_json_hold;
int tap_route_json_fields(const json_t *obj, bool allow_null, uint32_t max_depth, struct tap_route_json_hold **hold,
                          const struct tap_route_field **fields, size_t *n, char *err, size_t err_cap);
void tap_route_json_free(struct tap_route_json_hold *hold);

#endif

/* The JSON of --fault-api (src/DESIGN.md "Fault injection"), pure: the body of POST /api/faults into a rule, and
 * the rules in force as GET /api/faults, the reply to a POST and /api/status show them. The HTTP side (methods,
 * token, handing changes to the forwarding loop) is src/io/faultapi.c. */
#ifndef AMQPTAP_FAULT_API_H
#define AMQPTAP_FAULT_API_H

#include "amqptap/fault.h"
#include "amqptap/json.h"

#include <stddef.h>

#define TAP_FAULT_API_BODY_MAX 1024 /* bytes of a POST body (TAP_ADMIN_MAX_BODY: evhttp refuses more with 413) */

/* A POST body, {"rule": "ACTION[:KEY=VALUE,...]"} and no other member, into a rule (tap_fault_parse's grammar).
 * Returns 0, or TAP_E_USAGE with one printable line in err: what is wrong with the JSON, or tap_fault_parse's
 * message naming the rule. Parsed with jansson, whose allocator is process-wide (route_defs.c counts it while it
 * parses definitions): call it on the thread that loads definitions, never beside it. */
int tap_fault_api_rule(const char *body, size_t len, struct tap_fault_rule *out, char *err, size_t cap);

/* Rule i of s: {"id", "action", "text", "added" (a timestamp), "acted" (how often it acted, all connections)}. */
void tap_fault_api_rule_json(struct tap_json *j, const struct tap_fault_set *s, size_t i);

/* The rules in force, in the order they are tried: [rule, ...]. */
void tap_fault_api_rules_json(struct tap_json *j, const struct tap_fault_set *s);

/* {"error": why}: the body of a refused request. */
void tap_fault_api_error_json(struct tap_buf *out, const char *why);

#endif

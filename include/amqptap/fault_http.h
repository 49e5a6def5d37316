/* --fault-api (io): /api/faults on the --metrics endpoint. admin.c hands it the requests for its paths on the http
 * thread, after the Host check and the rate; it checks the bearer token (--fault-api-token), then hands every list
 * and change to the forwarding loop, which owns the rule set the connections read (struct tap_fault_set is not
 * shared: the loop changes it between two reads of a connection, so a rule added acts on the next publish it
 * selects, one removed selects none after it). The JSON is amqptap/fault_api.h's.
 *
 *   POST   /api/faults      {"rule": "nack:every=10"}  201 the rule; 400 {"error"}; 409 when 16 are in force
 *   GET    /api/faults      200 {"rules": [...]}
 *   GET    /api/faults/ID   200 the rule; 404
 *   DELETE /api/faults/ID   204; 404
 *   without the token or with another: 401 (before anything else is looked at) */
#ifndef AMQPTAP_FAULT_HTTP_H
#define AMQPTAP_FAULT_HTTP_H

#include "amqptap/fault.h"

#include <stdbool.h>
#include <stddef.h>

struct event_base;
struct evhttp_request;
struct tap_fault_http;

/* The API over set (borrowed: the loop's, on base) with the token in the file token_path (NULL: none). Returns NULL
 * with one line in err (naming --fault-api-token) and the exit code in *code: 2 for a token file that cannot be
 * read, is open to group or others, or does not hold one token of 16 to 4096 printable characters; 1 without
 * memory. */
struct tap_fault_http *tap_fault_http_new(struct event_base *base, struct tap_fault_set *set, const char *token_path,
                                          char *err, size_t cap, int *code);
/* Whether path ("/api/faults", "/api/faults/3", ...) is the API's. */
bool tap_fault_http_path(const char *path);
/* Answers req for path, on the http thread; waits for the loop at most TAP_ADMIN_RENDER_WAIT_MS (then 503, and the
 * change is not made). */
void tap_fault_http_answer(struct tap_fault_http *f, struct evhttp_request *req, const char *path);
/* Ends every wait for the loop (tap_admin_free, before it joins the http thread); later requests get 503. */
void tap_fault_http_quit(struct tap_fault_http *f);
/* On the loop, after the http thread has gone (tap_admin_free); f may be NULL. */
void tap_fault_http_free(struct tap_fault_http *f);

#endif

/* TLS on both legs (io layer, OpenSSL): a server context for clients that
 * speak TLS to the tap, a client context for the broker with verification,
 * host name check and SNI, and an NSS key log shared by both. */
#ifndef AMQPTAP_TLS_H
#define AMQPTAP_TLS_H

#include "amqptap/conf.h"

#include <stdbool.h>
#include <stddef.h>

struct ssl_st;
struct bufferevent;
struct tap_tls;

/* Builds the contexts the configuration asks for (none: a tap_tls that
 * does nothing). On failure returns NULL with a one-line message naming the
 * option and file in err, and *exit_code 2 (configuration) or 1. */
struct tap_tls *tap_tls_new(const struct tap_conf *conf, char *err, size_t cap, int *exit_code);
void tap_tls_free(struct tap_tls *t);

bool tap_tls_listener(const struct tap_tls *t); /* clients speak TLS */
bool tap_tls_upstream(const struct tap_tls *t); /* the broker speaks TLS */

/* A fresh SSL for one accepted client / one upstream connection (SNI and
 * the expected host name set), or NULL when out of memory. */
struct ssl_st *tap_tls_accept_ssl(struct tap_tls *t);
struct ssl_st *tap_tls_connect_ssl(struct tap_tls *t);

/* The reason OpenSSL gave for the last failure on bev (its error queue is
 * drained), as one line in out. False, with out untouched, when OpenSSL
 * reported nothing: the failure was the socket's (refused, reset, EOF). */
bool tap_tls_error(struct bufferevent *bev, char *out, size_t cap);

#endif

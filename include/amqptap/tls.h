/* TLS on both legs (io layer, OpenSSL): a server context for clients that
 * speak TLS to the tap, a client context for the broker with verification,
 * host name check and SNI, and an NSS key log shared by both. */
#ifndef AMQPTAP_TLS_H
#define AMQPTAP_TLS_H

#include "amqptap/conf.h"

#include <stdbool.h>
#include <stddef.h>

struct ssl_st;
struct tap_tls;

/* Plaintext one wakeup decrypts into a peer's queue at once (several records). */
#define TAP_TLS_READ_SPACE (64 * 1024)
/* Plaintext per SSL_write: one full-size record. */
#define TAP_TLS_RECORD 16384

/* Builds the contexts the configuration asks for (none: a tap_tls that
 * does nothing). On failure returns NULL with a one-line message naming the
 * option and file in err, and *exit_code 2 (configuration) or 1. */
struct tap_tls *tap_tls_new(const struct tap_conf *conf, char *err, size_t cap, int *exit_code);
void tap_tls_free(struct tap_tls *t);

bool tap_tls_listener(const struct tap_tls *t); /* clients speak TLS */
bool tap_tls_upstream(const struct tap_tls *t); /* the broker speaks TLS */

/* A fresh SSL on the socket fd of one accepted client / one upstream
 * connection (SNI and the expected host name set, the last upstream session
 * offered), or NULL when out of memory. The fd stays the caller's. */
struct ssl_st *tap_tls_accept_ssl(struct tap_tls *t, int fd);
struct ssl_st *tap_tls_connect_ssl(struct tap_tls *t, int fd);

/* The outcome of one non-blocking step on a TLS leg. */
enum tap_tls_step {
	TAP_TLS_OK,         /* the handshake is done, or bytes were moved */
	TAP_TLS_WANT_READ,  /* call again once the socket is readable */
	TAP_TLS_WANT_WRITE, /* call again once the socket is writable (a write: with the same length) */
	TAP_TLS_CLOSED,     /* the peer ended the stream (close_notify, or EOF without it) */
	TAP_TLS_FAILED,     /* why: OpenSSL's reason (verification result included), or "" and errno */
};

/* Each writes why (cap bytes) only on TAP_TLS_FAILED. */
enum tap_tls_step tap_tls_handshake(struct ssl_st *ssl, char *why, size_t cap);
enum tap_tls_step tap_tls_read(struct ssl_st *ssl, void *buf, size_t cap, size_t *got, char *why, size_t why_cap);
enum tap_tls_step tap_tls_write(struct ssl_st *ssl, const void *buf, size_t len, size_t *put, char *why,
                                size_t why_cap);
/* OpenSSL holds input (records read ahead, or decrypted bytes) that no
 * readiness event will announce. */
bool tap_tls_pending(const struct ssl_st *ssl);
/* Whether a byte has come from the peer on this SSL's socket. */
bool tap_tls_heard(const struct ssl_st *ssl);
/* An SSL keeps its record buffers between records (a busy leg:
 * SSL_MODE_RELEASE_BUFFERS would free and allocate them around every
 * record), or gives them back (a quiet one: they are freed now unless they
 * hold part of a record, and after each record from then on). */
void tap_tls_keep_buffers(struct ssl_st *ssl);
void tap_tls_release_buffers(struct ssl_st *ssl);
/* An SSL's reads go to a buffer of its own rather than the one all legs
 * share while a step runs on another thread than the loop (apart), and to
 * the shared one again once it is back (rejoin). */
void tap_tls_apart(struct ssl_st *ssl);
void tap_tls_rejoin(struct ssl_st *ssl);
/* Frees an SSL (NULL: nothing), at once or first trying once to send close_notify. */
void tap_tls_free_ssl(struct ssl_st *ssl);
void tap_tls_close_ssl(struct ssl_st *ssl);

#endif

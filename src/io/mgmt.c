/* --management (mgmt.h): GET {URL}/api/definitions every interval with libevent's HTTP client; https verifies the
 * broker's chain (--management-ca, else the system store) and host name, and sends SNI. One request at a time, a new
 * connection each, bounded in time (10 s) and size (max_body). The body goes to the caller, which parses it.
 * The host name is resolved by evdns on the loop (a NULL dns base would make libevent call getaddrinfo on the relay
 * thread, blocking every connection for as long as the resolver takes); /etc/hosts is read once at start. */
#include "amqptap/mgmt.h"

#include "amqptap/files.h"

#include <event2/buffer.h>
#include <event2/bufferevent_ssl.h>
#include <event2/dns.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct tap_mgmt {
	struct event_base *base;
	struct evdns_base *dns; /* NULL only if evdns cannot start: then libevent resolves blocking */
	char host[256], path[1024], auth[700];
	int port;
	bool https;
	SSL_CTX *ctx;
	size_t max_body;
	struct timeval every;
	struct event *timer, *reap;
	struct evhttp_connection *conn, *dead;
	bool busy;
	tap_mgmt_fn fn;
	void *arg;
};

static void poll_now(evutil_socket_t fd, short what, void *arg);

static void reap(evutil_socket_t fd, short what, void *arg)
{
	struct tap_mgmt *m = arg;
	(void)fd;
	(void)what;
	if (m->dead)
		evhttp_connection_free(m->dead);
	m->dead = NULL;
}

/* The connection is freed outside its own callback, on the next turn of the loop. */
static void done(struct tap_mgmt *m, const char *body, size_t len, const char *err)
{
	m->dead = m->conn;
	m->conn = NULL;
	m->busy = false;
	event_active(m->reap, 0, 0);
	m->fn(m->arg, body, len, err);
}

/* Why a TLS connection failed, "" when it did not get that far: libevent moves OpenSSL's errors off the thread's queue
 * onto the bufferevent, and the chain's verdict stays in the SSL ("certificate verify failed (self-signed
 * certificate in certificate chain)" names the cause an operator fixes). */
static void tls_reason(const struct tap_mgmt *m, char *out, size_t cap)
{
	out[0] = '\0';
	struct bufferevent *bev = m->https && m->conn ? evhttp_connection_get_bufferevent(m->conn) : NULL;
	unsigned long e = bev ? bufferevent_get_openssl_error(bev) : 0;
	if (!e)
		e = ERR_get_error();
	ERR_clear_error();
	SSL *ssl = bev ? bufferevent_openssl_get_ssl(bev) : NULL;
	long v = ssl ? SSL_get_verify_result(ssl) : X509_V_OK;
	const char *reason = e ? ERR_reason_error_string(e) : NULL;
	if (v != X509_V_OK)
		snprintf(out, cap, ": %s (%s)", reason ? reason : "certificate verify failed",
			 X509_verify_cert_error_string(v));
	else if (reason)
		snprintf(out, cap, ": %s", reason);
}

static void on_response(struct evhttp_request *req, void *arg)
{
	struct tap_mgmt *m = arg;
	char err[400];
	if (!req || evhttp_request_get_response_code(req) == 0) {
		char why[200];
		tls_reason(m, why, sizeof why);
		snprintf(err, sizeof err, "%s %s:%d%s", why[0] ? "TLS failed with" : "no answer from", m->host, m->port,
			 why);
		done(m, NULL, 0, err);
		return;
	}
	int code = evhttp_request_get_response_code(req);
	if (code != 200) {
		snprintf(err, sizeof err, "HTTP %d from %s:%d%s", code, m->host, m->port,
			 code == 401 ? " (check --management-credentials)" : "");
		done(m, NULL, 0, err);
		return;
	}
	struct evbuffer *in = evhttp_request_get_input_buffer(req);
	size_t len = evbuffer_get_length(in);
	char *body = malloc(len + 1);
	if (!body) {
		done(m, NULL, 0, "out of memory for the definitions");
		return;
	}
	evbuffer_copyout(in, body, len);
	body[len] = '\0';
	done(m, body, len, NULL);
	free(body);
}

static void poll_now(evutil_socket_t fd, short what, void *arg)
{
	struct tap_mgmt *m = arg;
	(void)fd;
	(void)what;
	if (m->busy)
		return;
	struct bufferevent *bev = NULL;
	if (m->https) {
		SSL *ssl = SSL_new(m->ctx);
		if (!ssl) {
			m->fn(m->arg, NULL, 0, "out of memory for TLS");
			return;
		}
		SSL_set_tlsext_host_name(ssl, m->host);
		X509_VERIFY_PARAM_set1_host(SSL_get0_param(ssl), m->host, 0);
		bev = bufferevent_openssl_socket_new(m->base, -1, ssl, BUFFEREVENT_SSL_CONNECTING,
						     BEV_OPT_CLOSE_ON_FREE | BEV_OPT_DEFER_CALLBACKS);
		if (!bev) {
			SSL_free(ssl);
			m->fn(m->arg, NULL, 0, "out of memory for TLS");
			return;
		}
	}
	m->conn = bev ? evhttp_connection_base_bufferevent_new(m->base, m->dns, bev, m->host, (unsigned short)m->port)
		      : evhttp_connection_base_new(m->base, m->dns, m->host, (unsigned short)m->port);
	if (!m->conn) {
		if (bev)
			bufferevent_free(bev);
		m->fn(m->arg, NULL, 0, "out of memory for the request");
		return;
	}
	evhttp_connection_set_timeout(m->conn, 10);
	evhttp_connection_set_max_body_size(m->conn, (ev_ssize_t)m->max_body);
	struct evhttp_request *req = evhttp_request_new(on_response, m);
	if (!req) {
		evhttp_connection_free(m->conn);
		m->conn = NULL;
		m->fn(m->arg, NULL, 0, "out of memory for the request");
		return;
	}
	struct evkeyvalq *h = evhttp_request_get_output_headers(req);
	evhttp_add_header(h, "Host", m->host);
	evhttp_add_header(h, "Accept", "application/json");
	if (m->auth[0])
		evhttp_add_header(h, "Authorization", m->auth);
	m->busy = true;
	if (evhttp_make_request(m->conn, req, EVHTTP_REQ_GET, m->path) != 0) {
		/* the request is freed by libevent on failure */
		m->busy = false;
		evhttp_connection_free(m->conn);
		m->conn = NULL;
		m->fn(m->arg, NULL, 0, "the request could not be made");
	}
}

struct tap_mgmt *tap_mgmt_new(struct event_base *base, const char *url, const char *credentials, const char *ca_file,
			      int64_t interval_us, size_t max_body, tap_mgmt_fn fn, void *arg, char *err, size_t cap)
{
	struct tap_mgmt *m = calloc(1, sizeof *m);
	struct evhttp_uri *u = evhttp_uri_parse(url);
	if (!m || !u) {
		snprintf(err, cap, m ? "not a URL: %s" : "out of memory", url);
		goto fail;
	}
	const char *scheme = evhttp_uri_get_scheme(u), *host = evhttp_uri_get_host(u), *path = evhttp_uri_get_path(u);
	if (!scheme || (strcmp(scheme, "http") && strcmp(scheme, "https")) || !host || !*host ||
	    strlen(host) >= sizeof m->host || evhttp_uri_get_userinfo(u) || evhttp_uri_get_query(u)) {
		snprintf(err, cap, "%s: expected http[s]://HOST[:PORT][/PATH] (credentials go in --management-credentials)",
			 url);
		goto fail;
	}
	m->https = !strcmp(scheme, "https");
	snprintf(m->host, sizeof m->host, "%s", host);
	m->port = evhttp_uri_get_port(u) > 0 ? evhttp_uri_get_port(u) : m->https ? 443 : 80;
	size_t pl = path ? strlen(path) : 0;
	while (pl && path[pl - 1] == '/')
		pl--;
	if (pl + sizeof "/api/definitions" > sizeof m->path) {
		snprintf(err, cap, "%s: path too long", url);
		goto fail;
	}
	snprintf(m->path, sizeof m->path, "%.*s/api/definitions", (int)pl, path ? path : "");
	if (credentials) {
		/* user:password, base64 for Basic; never logged */
		size_t cl = strlen(credentials);
		if (cl == 0 || !strchr(credentials, ':') || cl > 500) {
			snprintf(err, cap, "--management-credentials: expected one line USER:PASSWORD");
			goto fail;
		}
		memcpy(m->auth, "Basic ", 6);
		EVP_EncodeBlock((unsigned char *)m->auth + 6, (const unsigned char *)credentials, (int)cl);
	}
	if (m->https) {
		m->ctx = SSL_CTX_new(TLS_client_method());
		if (!m->ctx || SSL_CTX_set_min_proto_version(m->ctx, TLS1_2_VERSION) != 1 ||
		    (ca_file ? SSL_CTX_load_verify_locations(m->ctx, ca_file, NULL) != 1
			     : SSL_CTX_set_default_verify_paths(m->ctx) != 1)) {
			unsigned long e = ERR_get_error();
			snprintf(err, cap, "--management-ca %s: %s", ca_file ? ca_file : "(system store)",
				 e ? ERR_reason_error_string(e) : "cannot be used");
			ERR_clear_error();
			goto fail;
		}
		SSL_CTX_set_verify(m->ctx, SSL_VERIFY_PEER, NULL);
	}
	m->base = base;
	/* DISABLE_WHEN_INACTIVE: an idle resolver keeps no event, so a one-shot loop still ends */
	m->dns = evdns_base_new(base, EVDNS_BASE_INITIALIZE_NAMESERVERS | EVDNS_BASE_DISABLE_WHEN_INACTIVE);
	m->max_body = max_body;
	m->fn = fn;
	m->arg = arg;
	m->every = (struct timeval){(time_t)(interval_us / 1000000), (suseconds_t)(interval_us % 1000000)};
	m->timer = event_new(base, -1, EV_PERSIST, poll_now, m);
	m->reap = event_new(base, -1, 0, reap, m);
	if (!m->timer || !m->reap || event_add(m->timer, &m->every) != 0) {
		snprintf(err, cap, "out of memory");
		goto fail;
	}
	evhttp_uri_free(u);
	event_active(m->timer, 0, 0); /* the first poll at once */
	return m;
fail:
	if (u)
		evhttp_uri_free(u);
	tap_mgmt_free(m);
	return NULL;
}

void tap_mgmt_free(struct tap_mgmt *m)
{
	if (!m)
		return;
	if (m->timer)
		event_free(m->timer);
	if (m->reap)
		event_free(m->reap);
	if (m->conn)
		evhttp_connection_free(m->conn);
	if (m->dead)
		evhttp_connection_free(m->dead);
	if (m->dns)
		evdns_base_free(m->dns, 0);
	if (m->ctx)
		SSL_CTX_free(m->ctx);
	OPENSSL_cleanse(m->auth, sizeof m->auth);
	free(m);
}

int tap_mgmt_credentials_read(const char *path, char **out, char *err, size_t cap)
{
	size_t len;
	if (tap_files_read(path, 4096, out, &len, err, cap))
		return -1;
	while (len && ((*out)[len - 1] == '\n' || (*out)[len - 1] == '\r'))
		(*out)[--len] = '\0';
	return 0;
}

void tap_mgmt_credentials_free(char *credentials)
{
	if (!credentials)
		return;
	OPENSSL_cleanse(credentials, strlen(credentials));
	free(credentials);
}

/* --- one fetch, waited for ------------------------------------------------------------------------------------ */

struct fetch {
	struct event_base *base;
	char *body;
	size_t len;
	char err[400];
	bool done;
};

static void on_fetched(void *arg, const char *body, size_t len, const char *err)
{
	struct fetch *f = arg;
	f->done = true;
	event_base_loopbreak(f->base); /* the poller's timer would go on */
	if (err) {
		snprintf(f->err, sizeof f->err, "%s", err);
		return;
	}
	f->body = malloc(len + 1);
	if (!f->body) {
		snprintf(f->err, sizeof f->err, "out of memory for the definitions");
		return;
	}
	memcpy(f->body, body, len + 1); /* on_response's copy ends in a NUL */
	f->len = len;
}

enum tap_mgmt_fetch tap_mgmt_fetch_once(const char *url, const char *credentials, const char *ca_file, size_t max_body,
					char **body, size_t *len, char *err, size_t cap)
{
	*body = NULL;
	*len = 0;
	struct fetch f = {.base = event_base_new()};
	if (!f.base) {
		snprintf(err, cap, "out of memory");
		return TAP_MGMT_NOT_ANSWERED;
	}
	/* the poller as the tap runs it; its next poll (an hour away) never comes: the first answer ends the loop */
	struct tap_mgmt *m = tap_mgmt_new(f.base, url, credentials, ca_file, (int64_t)3600 * 1000000, max_body,
					  on_fetched, &f, err, cap);
	if (!m) {
		event_base_free(f.base);
		return TAP_MGMT_BAD_SETUP;
	}
	while (!f.done && event_base_dispatch(f.base) == 0)
		;
	tap_mgmt_free(m);
	event_base_free(f.base);
	if (!f.done || !f.body) {
		snprintf(err, cap, "%s", f.done ? f.err : "the event loop failed");
		return TAP_MGMT_NOT_ANSWERED;
	}
	*body = f.body;
	*len = f.len;
	return TAP_MGMT_FETCHED;
}

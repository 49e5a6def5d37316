/* OpenSSL contexts for both legs, the key log, and the steps the proxy runs
 * on a TLS leg (handshake, read, write), each a non-blocking call on the
 * leg's socket whose outcome is one enum value. Verification follows
 * libevent's sample/https-client.c: SSL_VERIFY_PEER with the system store
 * or --upstream-ca, host name via SSL_set1_host (or the IP), SNI when the
 * name is not an address literal. The upstream leg resumes the last session
 * the broker gave (HAProxy's default; --upstream-no-reuse turns it off, as
 * HAProxy's no-ssl-reuse and nginx's proxy_ssl_session_reuse off do): a
 * resumed handshake spares both sides the certificate and the signatures.
 * Only sessions of handshakes that verified the broker's chain and name
 * (or of --upstream-insecure ones, which verify nothing) are kept, and the
 * context only ever checks the one name, so a resumption never skips a
 * check a full handshake would make. The listener issues TLS 1.3 tickets / TLS 1.2 session ids to
 * clients (OpenSSL's defaults), so a client that reconnects with its session
 * costs the tap no signature. Each leg reads its socket through a BIO of
 * the tap's own (reader_read) and writes it through a socket BIO. */
#include "amqptap/tls.h"

#include "amqptap/log.h"
#include "amqptap/out.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct tap_tls {
	SSL_CTX *server;
	SSL_CTX *client;
	char expect_name[256]; /* SNI / host name check for the broker */
	bool expect_ip;
	struct tap_out *keylog; /* the key log's writer thread: a slow or stuck file never holds the loop up */
	SSL_SESSION *upstream_session; /* the broker's latest session, offered by the next upstream connection */
	BIO_METHOD *sock_reader;
	uint8_t *shared;             /* TAP_TLS_READ_SPACE: every leg reads its socket into it */
	struct reader *shared_owner; /* whose bytes it holds, if any */
};

/* What a leg's reading BIO holds: ciphertext read from the socket that
 * OpenSSL has not asked for yet, in the shared buffer or, when another leg
 * needed that, in one of its own. */
struct reader {
	struct tap_tls *t;
	int fd;
	uint8_t *own; /* NULL unless its bytes had to leave the shared buffer (or never were in it) */
	size_t off, len;
	bool apart; /* on the handshaker's thread: reads go to `own` (tap_tls_apart) */
};

/* What a leg reads apart from the shared buffer at once: a ClientHello
 * nearly always fits; a longer one takes more reads. */
#define APART_SPACE 4096

/* The oldest queued OpenSSL error as text, queue drained. */
static void drain_errors(char *out, size_t cap)
{
	unsigned long e, first = 0;
	while ((e = ERR_get_error()) != 0)
		if (!first)
			first = e;
	if (first)
		ERR_error_string_n(first, out, cap);
	else
		snprintf(out, cap, "unknown TLS error");
}

static struct tap_tls *fail(struct tap_tls *t, char *err, size_t cap, int *exit_code, int code, const char *fmt, ...)
	__attribute__((format(printf, 6, 7)));

static struct tap_tls *fail(struct tap_tls *t, char *err, size_t cap, int *exit_code, int code, const char *fmt, ...)
{
	char why[256] = "";
	if (ERR_peek_error() != 0)
		drain_errors(why, sizeof why);
	char what[300];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(what, sizeof what, fmt, ap);
	va_end(ap);
	snprintf(err, cap, "%s%s%s", what, why[0] ? ": " : "", why);
	*exit_code = code;
	tap_tls_free(t);
	return NULL;
}

static void keylog_line(const SSL *ssl, const char *line)
{
	struct tap_tls *t = SSL_CTX_get_app_data(SSL_get_SSL_CTX(ssl));
	if (!t || !t->keylog)
		return;
	size_t n = strlen(line);
	char buf[1024];
	if (n + 1 > sizeof buf)
		return;
	memcpy(buf, line, n);
	buf[n] = '\n';
	tap_out_text(t->keylog, buf, n + 1); /* whole lines: the two legs' lines never interleave */
}

/* Keeps the broker's newest session for the next upstream connection, if
 * it comes from a handshake that checked what a full one checks. */
static int on_new_upstream_session(SSL *ssl, SSL_SESSION *session)
{
	struct tap_tls *t = SSL_CTX_get_app_data(SSL_get_SSL_CTX(ssl));
	if (!t || !SSL_SESSION_is_resumable(session))
		return 0;
	/* verified: the chain, and the name (SSL_set1_host) unless the broker
	 * is an address; a resumed handshake inherits the check of the session
	 * it resumed, which was kept only if verified */
	bool insecure = SSL_get_verify_mode(ssl) == SSL_VERIFY_NONE;
	bool verified = SSL_get_verify_result(ssl) == X509_V_OK && (t->expect_ip || SSL_get0_peername(ssl) != NULL);
	if (!insecure && !verified && !SSL_session_reused(ssl))
		return 0;
	SSL_SESSION_free(t->upstream_session);
	t->upstream_session = session;
	return 1; /* the reference is ours now */
}

/* The reading BIO: one read() of up to TAP_TLS_READ_SPACE bytes into a
 * buffer all legs on the loop's thread share, handed to OpenSSL as it asks
 * (read-ahead off: a record header, then its body), so every byte is copied
 * once and never moved; OpenSSL's own read-ahead moves all its buffer still
 * holds before each record. A leg nearly always takes all it read before
 * another leg reads; if not, its rest moves to a buffer of its own, so an
 * idle leg holds none. A leg whose step runs on the handshaker's thread
 * reads into a buffer of its own. */
static const uint8_t *reader_data(const struct reader *r)
{
	return r->own ? r->own : r->t->shared;
}

/* Moves the rest of what r holds out of the shared buffer. */
static bool reader_evict(struct reader *r)
{
	uint8_t *own = malloc(r->len);
	if (!own)
		return false;
	memcpy(own, r->t->shared + r->off, r->len);
	r->own = own;
	r->off = 0;
	r->t->shared_owner = NULL;
	return true;
}

static int reader_read(BIO *b, char *out, int n)
{
	struct reader *r = BIO_get_data(b);
	struct tap_tls *t = r->t;
	BIO_clear_retry_flags(b);
	if (n <= 0)
		return 0;
	if (r->len == 0) {
		uint8_t *into = t->shared;
		size_t cap = TAP_TLS_READ_SPACE;
		if (r->apart) {
			into = r->own = malloc(APART_SPACE);
			cap = APART_SPACE;
		} else {
			struct reader *other = t->shared_owner;
			if (other && other != r && other->len > 0 && !reader_evict(other))
				into = NULL;
		}
		if (!into) {
			errno = ENOMEM;
			return -1;
		}
		ssize_t got = read(r->fd, into, cap);
		if (got <= 0) {
			int err = errno;
			if (r->apart) {
				free(r->own);
				r->own = NULL;
			} else {
				t->shared_owner = NULL;
			}
			if (got < 0 && (err == EAGAIN || err == EWOULDBLOCK || err == EINTR))
				BIO_set_retry_read(b);
			errno = got < 0 ? err : 0;
			return got < 0 ? -1 : 0;
		}
		if (!r->apart)
			t->shared_owner = r;
		r->off = 0;
		r->len = (size_t)got;
	}
	size_t k = (size_t)n < r->len ? (size_t)n : r->len;
	memcpy(out, reader_data(r) + r->off, k);
	r->off += k;
	r->len -= k;
	if (r->len == 0 && r->own) {
		free(r->own);
		r->own = NULL;
	}
	return (int)k;
}

static long reader_ctrl(BIO *b, int cmd, long num, void *ptr)
{
	struct reader *r = BIO_get_data(b);
	(void)num;
	switch (cmd) {
	case BIO_CTRL_PENDING:
		return (long)r->len;
	case BIO_CTRL_FLUSH:
		return 1;
	case BIO_C_GET_FD:
		if (ptr)
			*(int *)ptr = r->fd;
		return r->fd;
	default:
		return 0;
	}
}

static int reader_free(BIO *b)
{
	struct reader *r = BIO_get_data(b);
	if (r) {
		if (r->t->shared_owner == r)
			r->t->shared_owner = NULL;
		free(r->own);
		free(r);
	}
	BIO_set_data(b, NULL);
	return 1;
}

/* The leg's BIOs on fd: the reading one above, a socket BIO for writes. */
static bool set_bios(struct tap_tls *t, SSL *ssl, int fd)
{
	struct reader *r = calloc(1, sizeof *r);
	BIO *rb = r ? BIO_new(t->sock_reader) : NULL;
	BIO *wb = rb ? BIO_new_socket(fd, BIO_NOCLOSE) : NULL;
	if (!wb) {
		BIO_free(rb); /* frees r when it was attached: it is not yet */
		free(r);
		return false;
	}
	r->t = t;
	r->fd = fd;
	BIO_set_data(rb, r);
	BIO_set_init(rb, 1);
	SSL_set_bio(ssl, rb, wb);
	return true;
}

static bool readable(const char *path)
{
	return access(path, R_OK) == 0;
}

static SSL_CTX *new_ctx(struct tap_tls *t, const SSL_METHOD *method)
{
	SSL_CTX *ctx = SSL_CTX_new(method);
	if (!ctx)
		return NULL;
	SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
	SSL_CTX_set_app_data(ctx, t);
	/* partial writes: one record per SSL_write, retried from the queue's
	 * head wherever it now lives; record buffers released between records
	 * until tlsleg.c finds the leg busy (tap_tls_keep_buffers) */
	SSL_CTX_set_mode(ctx, SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER | SSL_MODE_ENABLE_PARTIAL_WRITE |
				      SSL_MODE_RELEASE_BUFFERS);
	/* no read-ahead: OpenSSL asks the reading BIO for each record. With
	 * read-ahead it moves all its buffer still holds to the front before
	 * each record of 128 bytes or more (callgrind through the tap without
	 * handshakes, W=1000 64 B per 20,000 messages / W=100 4 KiB per 10,000
	 * / W=10 1 MiB per 50: 2,365 / 1,304 / 506 M instructions with a
	 * 64 KiB read-ahead buffer, 823 / 753 / 424 M with OpenSSL's one-record
	 * buffer, 516 / 546 / 471 M with the reading BIO, which also makes the
	 * fewest system calls: strace, 6.2 k / 5.4 k / 16.9 k against 10.2 k /
	 * 14.9 k / 33.3 k with the one-record buffer) */
	/* a peer that closes TCP without close_notify has ended, not failed */
	SSL_CTX_set_options(ctx, SSL_OP_IGNORE_UNEXPECTED_EOF);
	if (t->keylog)
		SSL_CTX_set_keylog_callback(ctx, keylog_line);
	return ctx;
}

/* OpenSSL's default for an encrypted key is to prompt on the terminal, which would hang a start under a service
 * manager that gives one, so no passphrase is ever given: the key fails to load and *userdata (a bool) says why. */
static int no_passphrase(char *buf, int size, int rwflag, void *userdata)
{
	(void)buf;
	(void)size;
	(void)rwflag;
	if (userdata)
		*(bool *)userdata = true;
	return -1;
}

/* Whether OpenSSL's oldest queued error is lib's reason. */
static bool first_error_is(int lib, int reason)
{
	unsigned long e = ERR_peek_error();
	return e && ERR_GET_LIB(e) == lib && ERR_GET_REASON(e) == reason;
}

/* Loads a certificate chain and its key into ctx, naming the options on failure. */
static bool load_pair(SSL_CTX *ctx, const char *cert_opt, const char *cert, const char *key_opt, const char *key,
		      char *what, size_t cap)
{
	if (!readable(cert)) {
		snprintf(what, cap, "%s %s: cannot read (%s)", cert_opt, cert, strerror(errno));
		return false;
	}
	if (!readable(key)) {
		snprintf(what, cap, "%s %s: cannot read (%s)", key_opt, key, strerror(errno));
		return false;
	}
	if (SSL_CTX_use_certificate_chain_file(ctx, cert) != 1) {
		snprintf(what, cap, "%s %s: not a PEM certificate", cert_opt, cert);
		return false;
	}
	bool encrypted = false;
	SSL_CTX_set_default_passwd_cb(ctx, no_passphrase);
	SSL_CTX_set_default_passwd_cb_userdata(ctx, &encrypted);
	int loaded = SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM);
	SSL_CTX_set_default_passwd_cb_userdata(ctx, NULL);
	if (loaded != 1 && encrypted) {
		ERR_clear_error();
		snprintf(what, cap, "%s %s: the key is encrypted, and amqptap asks for no passphrase: give it the key "
			 "without one (openssl pkey -in KEY -out NEWKEY, kept 0600)", key_opt, key);
		return false;
	}
	if (loaded != 1 && first_error_is(ERR_LIB_X509, X509_R_KEY_VALUES_MISMATCH)) {
		ERR_clear_error(); /* OpenSSL 3 checks the pair as it loads the key */
		snprintf(what, cap, "%s %s: does not match %s %s", key_opt, key, cert_opt, cert);
		return false;
	}
	if (loaded != 1) {
		snprintf(what, cap, "%s %s: not a PEM private key", key_opt, key);
		return false;
	}
	if (SSL_CTX_check_private_key(ctx) != 1) {
		snprintf(what, cap, "%s %s: does not match %s %s", key_opt, key, cert_opt, cert);
		return false;
	}
	return true;
}

static bool is_ip_literal(const char *s)
{
	unsigned char buf[16];
	return inet_pton(AF_INET, s, buf) == 1 || inet_pton(AF_INET6, s, buf) == 1;
}

struct tap_tls *tap_tls_new(const struct tap_conf *conf, char *err, size_t cap, int *exit_code)
{
	char what[600];
	struct tap_tls *t = calloc(1, sizeof *t);
	if (!t) {
		snprintf(err, cap, "out of memory");
		*exit_code = 1;
		return NULL;
	}
	t->sock_reader = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "amqptap socket reader");
	t->shared = malloc(TAP_TLS_READ_SPACE);
	if (!t->shared || !t->sock_reader || !BIO_meth_set_read(t->sock_reader, reader_read) ||
	    !BIO_meth_set_ctrl(t->sock_reader, reader_ctrl) || !BIO_meth_set_destroy(t->sock_reader, reader_free))
		return fail(t, err, cap, exit_code, 1, "TLS socket reader: out of memory");
	const char *keylog = conf->keylog ? conf->keylog : getenv("SSLKEYLOGFILE");
	const char *keylog_from = conf->keylog ? "--keylog" : "SSLKEYLOGFILE";
	bool any_tls = conf->tls_cert || conf->upstream_tls;
	if (keylog && *keylog && any_tls) {
		/* secrets: 0600 even when the file existed; a FIFO without a reader yet delays nothing */
		const struct tap_out_conf oc = {.name = "keylog", .path = keylog, .kind = TAP_OUT_TEXT,
						.private_mode = true};
		if (!(t->keylog = tap_out_open(&oc))) {
			snprintf(err, cap, "%s %s: %s", keylog_from, keylog,
				 errno == ELOOP ? "a symbolic link: refused (the key log holds secrets; give the file itself)"
						: strerror(errno));
			*exit_code = 2;
			tap_tls_free(t);
			return NULL;
		}
	}
	if (conf->tls_cert) {
		t->server = new_ctx(t, TLS_server_method());
		if (!t->server)
			return fail(t, err, cap, exit_code, 1, "TLS server context");
		if (!load_pair(t->server, "--tls-cert", conf->tls_cert, "--tls-key", conf->tls_key, what, sizeof what))
			return fail(t, err, cap, exit_code, 2, "%s", what);
		/* a session may only be resumed in the context it was made in; OpenSSL refuses to resume one on a
		 * context that verifies clients and has no name ("session id context uninitialized") */
		static const unsigned char sid_ctx[] = "amqptap";
		if (SSL_CTX_set_session_id_context(t->server, sid_ctx, sizeof sid_ctx - 1) != 1)
			return fail(t, err, cap, exit_code, 1, "TLS session id context");
		if (conf->tls_client_ca) {
			if (!readable(conf->tls_client_ca))
				return fail(t, err, cap, exit_code, 2, "--tls-client-ca %s: cannot read (%s)",
					    conf->tls_client_ca, strerror(errno));
			STACK_OF(X509_NAME) *names = SSL_load_client_CA_file(conf->tls_client_ca);
			if (!names ||
			    SSL_CTX_load_verify_locations(t->server, conf->tls_client_ca, NULL) != 1) {
				if (names)
					sk_X509_NAME_pop_free(names, X509_NAME_free);
				return fail(t, err, cap, exit_code, 2, "--tls-client-ca %s: cannot load", conf->tls_client_ca);
			}
			SSL_CTX_set_client_CA_list(t->server, names);
			SSL_CTX_set_verify(t->server, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, NULL);
		}
	}
	if (conf->upstream_tls) {
		t->client = new_ctx(t, TLS_client_method());
		if (!t->client)
			return fail(t, err, cap, exit_code, 1, "TLS client context");
		if (conf->upstream_insecure) {
			SSL_CTX_set_verify(t->client, SSL_VERIFY_NONE, NULL);
		} else {
			SSL_CTX_set_verify(t->client, SSL_VERIFY_PEER, NULL);
			if (conf->upstream_ca) {
				if (!readable(conf->upstream_ca))
					return fail(t, err, cap, exit_code, 2, "--upstream-ca %s: cannot read (%s)",
						    conf->upstream_ca, strerror(errno));
				if (SSL_CTX_load_verify_locations(t->client, conf->upstream_ca, NULL) != 1)
					return fail(t, err, cap, exit_code, 2, "--upstream-ca %s: cannot load",
						    conf->upstream_ca);
			} else if (SSL_CTX_set_default_verify_paths(t->client) != 1) {
				return fail(t, err, cap, exit_code, 1, "system CA store");
			}
		}
		if (conf->upstream_cert &&
		    !load_pair(t->client, "--upstream-cert", conf->upstream_cert, "--upstream-key", conf->upstream_key,
			       what, sizeof what))
			return fail(t, err, cap, exit_code, 2, "%s", what);
		if (conf->upstream_no_reuse) {
			SSL_CTX_set_session_cache_mode(t->client, SSL_SESS_CACHE_OFF);
		} else {
			SSL_CTX_set_session_cache_mode(t->client,
						       SSL_SESS_CACHE_CLIENT | SSL_SESS_CACHE_NO_INTERNAL_STORE);
			SSL_CTX_sess_set_new_cb(t->client, on_new_upstream_session);
		}
		snprintf(t->expect_name, sizeof t->expect_name, "%s",
			 conf->upstream_sni ? conf->upstream_sni : conf->upstream.host);
		t->expect_ip = is_ip_literal(t->expect_name);
	}
	return t;
}

void tap_tls_free(struct tap_tls *t)
{
	if (!t)
		return;
	SSL_SESSION_free(t->upstream_session);
	BIO_meth_free(t->sock_reader);
	free(t->shared);
	SSL_CTX_free(t->server);
	SSL_CTX_free(t->client);
	if (t->keylog) {
		struct tap_out_stats st;
		tap_out_close(t->keylog, tap_out_clock_us() + TAP_OUT_FLUSH_MS * 1000, &st);
		if (st.lost)
			tap_log_error("--keylog: %" PRIu64 " key lines lost (not written)", st.lost);
	}
	free(t);
}

bool tap_tls_listener(const struct tap_tls *t)
{
	return t && t->server;
}

bool tap_tls_upstream(const struct tap_tls *t)
{
	return t && t->client;
}

SSL *tap_tls_accept_ssl(struct tap_tls *t, int fd)
{
	SSL *ssl = SSL_new(t->server);
	if (!ssl)
		return NULL;
	if (!set_bios(t, ssl, fd)) {
		SSL_free(ssl);
		return NULL;
	}
	SSL_set_accept_state(ssl);
	return ssl;
}

SSL *tap_tls_connect_ssl(struct tap_tls *t, int fd)
{
	SSL *ssl = SSL_new(t->client);
	if (!ssl)
		return NULL;
	if (!set_bios(t, ssl, fd)) {
		SSL_free(ssl);
		return NULL;
	}
	SSL_set_connect_state(ssl);
	if (t->expect_ip) {
		X509_VERIFY_PARAM *param = SSL_get0_param(ssl);
		X509_VERIFY_PARAM_set1_ip_asc(param, t->expect_name);
	} else {
		SSL_set_tlsext_host_name(ssl, t->expect_name);
		SSL_set_hostflags(ssl, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
		SSL_set1_host(ssl, t->expect_name);
	}
	if (t->upstream_session)
		(void)SSL_set_session(ssl, t->upstream_session); /* failing that, a full handshake */
	return ssl;
}

/* What an SSL call's return value r means; on TAP_TLS_FAILED `why` holds
 * OpenSSL's reason (and the verification result), or is empty when the
 * socket failed (errno says how). The error queue is left empty. */
static enum tap_tls_step outcome(SSL *ssl, int r, char *why, size_t cap)
{
	int err = SSL_get_error(ssl, r);
	int saved = errno;
	switch (err) {
	case SSL_ERROR_WANT_READ:
		return TAP_TLS_WANT_READ;
	case SSL_ERROR_WANT_WRITE:
		return TAP_TLS_WANT_WRITE;
	case SSL_ERROR_ZERO_RETURN:
		return TAP_TLS_CLOSED;
	case SSL_ERROR_SYSCALL:
		ERR_clear_error();
		if (saved == 0)
			return TAP_TLS_CLOSED; /* EOF without close_notify */
		why[0] = '\0';
		errno = saved;
		return TAP_TLS_FAILED;
	default: {
		unsigned long e, first = 0;
		while ((e = ERR_get_error()) != 0)
			if (!first)
				first = e;
		char reason[256] = "TLS error";
		if (first)
			ERR_error_string_n(first, reason, sizeof reason);
		int code = first && ERR_GET_REASON(first) == ERR_R_MALLOC_FAILURE ? ENOMEM : EPROTO;
		long vr = SSL_get_verify_result(ssl);
		if (vr != X509_V_OK)
			snprintf(why, cap, "%s (%s)", reason, X509_verify_cert_error_string(vr));
		else
			snprintf(why, cap, "%s", reason);
		errno = code; /* ENOMEM: the tap's own shortage, not the peer's doing */
		return TAP_TLS_FAILED;
	}
	}
}

enum tap_tls_step tap_tls_handshake(SSL *ssl, char *why, size_t cap)
{
	ERR_clear_error();
	errno = 0;
	int r = SSL_do_handshake(ssl);
	return r == 1 ? TAP_TLS_OK : outcome(ssl, r, why, cap);
}

/* The error queue is empty between calls (outcome() drains it), so the
 * reads and writes do not clear it first: that costs a lookup per record. */
enum tap_tls_step tap_tls_read(SSL *ssl, void *buf, size_t cap, size_t *got, char *why, size_t why_cap)
{
	errno = 0;
	int r = SSL_read(ssl, buf, cap > INT_MAX ? INT_MAX : (int)cap);
	*got = r > 0 ? (size_t)r : 0;
	return r > 0 ? TAP_TLS_OK : outcome(ssl, r, why, why_cap);
}

enum tap_tls_step tap_tls_write(SSL *ssl, const void *buf, size_t len, size_t *put, char *why, size_t why_cap)
{
	errno = 0;
	int r = SSL_write(ssl, buf, len > INT_MAX ? INT_MAX : (int)len);
	*put = r > 0 ? (size_t)r : 0;
	return r > 0 ? TAP_TLS_OK : outcome(ssl, r, why, why_cap);
}

bool tap_tls_pending(const SSL *ssl)
{
	/* the reading BIO is always the reader (set_bios): asked directly, not through BIO_ctrl, as this is asked
	 * after every record */
	const struct reader *r = BIO_get_data(SSL_get_rbio(ssl));
	return SSL_has_pending(ssl) == 1 || (r && r->len > 0);
}

bool tap_tls_heard(const SSL *ssl)
{
	return BIO_number_read(SSL_get_rbio(ssl)) > 0; /* the BIO layer counts what each read returned */
}

static void set_apart(SSL *ssl, bool apart)
{
	struct reader *r = BIO_get_data(SSL_get_rbio(ssl));
	if (r)
		r->apart = apart;
}

void tap_tls_apart(SSL *ssl)
{
	set_apart(ssl, true);
}

void tap_tls_rejoin(SSL *ssl)
{
	set_apart(ssl, false);
}

void tap_tls_keep_buffers(SSL *ssl)
{
	SSL_clear_mode(ssl, SSL_MODE_RELEASE_BUFFERS);
}

void tap_tls_release_buffers(SSL *ssl)
{
	SSL_set_mode(ssl, SSL_MODE_RELEASE_BUFFERS);
	if (!tap_tls_pending(ssl))
		(void)SSL_free_buffers(ssl); /* 0 when a record is only partly read or written: kept */
}

void tap_tls_free_ssl(SSL *ssl)
{
	SSL_free(ssl); /* NULL: nothing */
}

void tap_tls_close_ssl(SSL *ssl)
{
	if (!ssl)
		return;
	/* one try at a close_notify: a socket that cannot take it now is closed without */
	(void)SSL_shutdown(ssl);
	ERR_clear_error();
	SSL_free(ssl);
}

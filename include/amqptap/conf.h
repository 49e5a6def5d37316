/* Command-line configuration: a declarative option table fills one struct
 * that is passed down explicitly (no globals). Parsing never exits: it
 * returns a status and a one-line message naming the bad option. */
#ifndef AMQPTAP_CONF_H
#define AMQPTAP_CONF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TAP_CONF_HOST_MAX 256

struct tap_conf_addr {
	char host[TAP_CONF_HOST_MAX]; /* without brackets for IPv6 */
	uint16_t port;
};

enum tap_conf_mode {
	TAP_MODE_PROXY,
	TAP_MODE_REPLAY,
	TAP_MODE_HELP,
	TAP_MODE_VERSION,
};

struct tap_conf {
	enum tap_conf_mode mode;
	struct tap_conf_addr listen;
	struct tap_conf_addr upstream;
	const char *verdicts;       /* "-" = stdout */
	const char *frames;         /* NULL = off */
	const char *pcap;           /* NULL = off */
	const char *replay_file;    /* replay mode: the capture */
	uint32_t replay_port;       /* replay mode: the broker's TCP port in the capture */
	uint32_t body_bytes;
	uint32_t return_window_ms;
	uint32_t late_return_ms;
	uint32_t max_outstanding;
	uint32_t grace_ms;
	uint32_t handshake_timeout_ms; /* TLS handshakes and the upstream connect; 0: no limit */
	/* TLS towards clients (listener) */
	const char *tls_cert, *tls_key, *tls_client_ca;
	/* TLS towards the broker */
	bool upstream_tls, upstream_insecure;
	const char *upstream_ca, *upstream_sni, *upstream_cert, *upstream_key;
	const char *keylog; /* NULL: $SSLKEYLOGFILE if set (main decides) */
};

/* Fills c with the defaults of DESIGN §1. */
void tap_conf_defaults(struct tap_conf *c);

/* Parses argv (argv[0] is the program). Strings in c point into argv.
 * Returns 0, or TAP_E_USAGE with a one-line message (no newline) in err. */
int tap_conf_parse(struct tap_conf *c, int argc, char **argv, char *err, size_t err_cap);

/* Parses "HOST:PORT" or "[V6]:PORT"; allow_port0 for listeners. */
int tap_conf_parse_addr(const char *s, bool allow_port0, struct tap_conf_addr *out);

/* Writes the --help text. */
void tap_conf_usage(char *out, size_t cap);

/* "host:port" or "[v6]:port" */
void tap_conf_addr_format(const struct tap_conf_addr *a, char *out, size_t cap);

#endif

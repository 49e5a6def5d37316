/* Command-line configuration: a declarative option table (name, kind, field, default, help) fills one struct
 * that is passed down explicitly (no globals). The same table drives the parser, --help, the man page and
 * the bash completion, so none of them can list an option the others lack. Parsing never exits: it returns
 * a status and a one-line message naming the bad option. */
#ifndef AMQPTAP_CONF_H
#define AMQPTAP_CONF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TAP_CONF_HOST_MAX 256
#define TAP_CONF_TAP_ID_MAX 256 /* bytes, with the NUL */
#define TAP_CONF_PORTS_MAX 16   /* --port given this many times at most */
#define TAP_CONF_FAULTS_MAX 16  /* --fault given this many times at most (TAP_FAULT_RULES_MAX) */

struct tap_conf_addr {
	char host[TAP_CONF_HOST_MAX]; /* without brackets for IPv6 */
	uint16_t port;
};

enum tap_conf_mode {
	TAP_MODE_PROXY,
	TAP_MODE_REPLAY,
	TAP_MODE_SNIFF,
	TAP_MODE_HELP,
	TAP_MODE_VERSION,
};

/* How much goes to stderr besides errors and warnings, which are always written. */
enum tap_conf_verbosity {
	TAP_VERBOSITY_QUIET,   /* -q: errors and warnings only */
	TAP_VERBOSITY_NORMAL,  /* start, stop and the summary */
	TAP_VERBOSITY_VERBOSE, /* -v: also one line per connection opened and closed */
};

struct tap_conf {
	enum tap_conf_mode mode;
	enum tap_conf_verbosity verbosity;
	struct tap_conf_addr listen;
	struct tap_conf_addr upstream;
	const char *verdicts;       /* "-" = stdout */
	const char *frames;         /* NULL = off */
	const char *pcap;           /* NULL = off */
	const char *replay_file;    /* replay mode: the capture */
	uint16_t ports[TAP_CONF_PORTS_MAX]; /* replay and sniff: the broker's TCP ports, every --port in order, or
	                                     * the default alone */
	size_t n_ports;
	const char *interface;      /* sniff mode: the interface libpcap captures on */
	uint32_t buffer_kib;        /* sniff mode: the kernel capture buffer */
	uint32_t body_bytes;
	uint32_t return_window_ms;
	uint32_t late_return_ms;
	uint32_t stall_after_s;       /* consumer_stalled */
	uint32_t consumer_timeout_ms; /* unacked_near_timeout */
	uint32_t max_outstanding;
	uint64_t max_tracking_memory; /* bytes; 0: TAP_TRACK_MAX_MEMORY_DEFAULT */
	uint32_t grace_ms;
	uint32_t handshake_timeout_ms; /* TLS handshakes and the upstream connect; 0: no limit */
	char tap_id[TAP_CONF_TAP_ID_MAX]; /* names this tap in merged records; default: the host name */
	/* TLS towards clients (listener) */
	const char *tls_cert, *tls_key, *tls_client_ca;
	/* TLS towards the broker */
	bool upstream_tls, upstream_insecure;
	bool upstream_no_reuse; /* no TLS session resumption towards the broker */
	const char *upstream_ca, *upstream_sni, *upstream_cert, *upstream_key;
	const char *header_values; /* --header-values KEY[,KEY...]; NULL: off */
	/* --identity auto|message_id|body|off (NULL: auto) and --resend-window (src/DESIGN.md §4b) */
	const char *identity;
	uint32_t resend_window_ms;
	const char *keylog; /* NULL: $SSLKEYLOGFILE if set (main decides) */
	struct tap_conf_addr metrics; /* --metrics: host "" = off */
	const char *metrics_hosts; /* --metrics-host NAME[,NAME...]; NULL: none beyond the defaults (httphost.h) */
	/* --definitions: the broker's definitions JSON every publish is judged by (README "Routing"); NULL: off */
	const char *definitions;
	uint32_t topology_interval_s; /* how often dropped_by_topology / topology_mismatch repeat per exchange+key, and
	                               * --management is polled */
	const char *management;             /* --management URL: the definitions polled from the management API */
	const char *management_credentials; /* a file holding USER:PASSWORD */
	const char *management_ca;          /* CA bundle for an https URL; NULL: the system store */
	/* --fault ACTION[:KEY=VALUE,...] (include/amqptap/fault.h), every one in order; each parsed once here */
	const char *faults[TAP_CONF_FAULTS_MAX];
	size_t n_faults;
	/* --fault-api: rules added and removed at run time on the --metrics endpoint (/api/faults, faultapi.h);
	 * --fault-api-token: a file holding the bearer token every request there must carry (NULL: none, loopback only) */
	bool fault_api;
	const char *fault_api_token;
};

enum tap_conf_opt_kind {
	TAP_OPT_ADDR_LISTEN, /* HOST:PORT, port 0 allowed */
	TAP_OPT_ADDR,        /* HOST:PORT */
	TAP_OPT_ADDR_LOCAL,  /* HOST:PORT, or PORT alone for loopback; port 0 allowed */
	TAP_OPT_PATH,        /* a file name (completed as one) */
	TAP_OPT_TEXT,        /* a name: printable, without spaces or quotes */
	TAP_OPT_IFACE,       /* a network interface name, checked as TEXT (completed as one) */
	TAP_OPT_ID,          /* copied into a char array: letters, digits and . _ - : @ / */
	TAP_OPT_U32,         /* a whole number within [min, max] */
	TAP_OPT_PORTS,       /* a whole number within [min, max] appended to ports[] each time (def_u32 when none) */
	TAP_OPT_SIZE,        /* bytes (uint64_t) within [min, max]: a whole number, optionally with K, M or G (KiB, MiB, GiB) */
	TAP_OPT_FAULT,       /* a fault rule (tap_fault_parse) appended to faults[] each time */
	TAP_OPT_FLAG,        /* sets a bool */
	TAP_OPT_LEVEL,       /* sets the verbosity to .level */
	TAP_OPT_HELP,
	TAP_OPT_VERSION,
};

/* One row of the option table. */
/* The modes an option is for (tap_conf_option.modes); given in another, it is a usage error. */
enum tap_conf_for {
	TAP_FOR_PROXY = 1 << 0,
	TAP_FOR_REPLAY = 1 << 1,
	TAP_FOR_SNIFF = 1 << 2,
};

struct tap_conf_option {
	const char *name;  /* long name without the dashes */
	unsigned modes;    /* enum tap_conf_for bits; 0: every mode */
	char short_name;   /* 0: none */
	enum tap_conf_opt_kind kind;
	size_t offset;     /* of the field in struct tap_conf */
	uint64_t min, max; /* TAP_OPT_U32, TAP_OPT_PORTS and TAP_OPT_SIZE bounds */
	enum tap_conf_verbosity level;
	const char *arg;   /* placeholder of the value; NULL for options that take none */
	/* The default: def is a command-line value that tap_conf_defaults applies through the parser (text kinds),
	 * def_u32 the number (TAP_OPT_U32). def_shown is what --help says instead when the value alone does not
	 * tell ("off", "the host name"); with neither def nor def_shown, --help says nothing. */
	const char *def;
	uint32_t def_u32;
	const char *def_shown;
	const char *help;
};

/* The table, in --help order. */
const struct tap_conf_option *tap_conf_options(size_t *count);

/* Fills c with the defaults of the table (src/DESIGN.md §1); tap_id is the host name. */
void tap_conf_defaults(struct tap_conf *c);

/* Whether two paths name one existing file (the same device and inode): tap_files_same_inode (files.h), for the
 * core looks at no file system. */
typedef bool (*tap_conf_same_inode_fn)(const char *a, const char *b);

/* Parses argv (argv[0] is the program) with getopt_long: --opt VALUE, --opt=VALUE, -o VALUE, -oVALUE, bundled
 * flags (-vq), "--" ends the options. Long names must be spelled out (no abbreviations). Later options
 * override earlier ones. Strings in c point into argv. No two outputs may be one file, nor one the capture being
 * replayed: same_inode tells which paths are (NULL: only paths spelt alike are). Returns 0, or TAP_E_USAGE with a
 * one-line message (no newline) in err that names the option. Not reentrant (getopt's state is global). */
/* --identity as enum tap_identity_mode (amqptap/identity.h), -1 when it names none. */
int tap_conf_identity_mode(const struct tap_conf *c);
int tap_conf_parse(struct tap_conf *c, int argc, char **argv, tap_conf_same_inode_fn same_inode, char *err,
		   size_t err_cap);

/* Which ports an address may have: a listener may take port 0 (the kernel picks one), a peer may not. */
enum tap_conf_port {
	TAP_CONF_PORT_NONZERO,
	TAP_CONF_PORT_ANY,
};

/* Parses "HOST:PORT" or "[V6]:PORT" with a port that ports allows. */
int tap_conf_parse_addr(const char *s, enum tap_conf_port ports, struct tap_conf_addr *out);

/* "host:port" or "[v6]:port" */
void tap_conf_addr_format(const struct tap_conf_addr *a, char *out, size_t cap);

/* The renderings of the table (conf_doc.c). Each writes at most cap bytes, always NUL-terminated when cap > 0,
 * and returns the length of the whole text (as snprintf does: call with cap 0 to size the buffer). */
size_t tap_conf_usage(char *out, size_t cap);
size_t tap_conf_man(char *out, size_t cap, const char *version);
size_t tap_conf_bash_completion(char *out, size_t cap);

#endif

/* The two directions of a proxied AMQP connection and the two peers that can end something. Values are
 * array indexes: per-direction state is `x[TAP_DIR_COUNT]`, indexed by the direction. */
#ifndef AMQPTAP_DIR_H
#define AMQPTAP_DIR_H

enum tap_dir {
	TAP_S2C = 0, /* broker to client */
	TAP_C2S = 1, /* client to broker */
};
#define TAP_DIR_COUNT 2

static inline enum tap_dir tap_dir_reverse(enum tap_dir d)
{
	return d == TAP_C2S ? TAP_S2C : TAP_C2S;
}

/* "c2s" / "s2c", as records and the frame trace write them. */
static inline const char *tap_dir_name(enum tap_dir d)
{
	return d == TAP_C2S ? "c2s" : "s2c";
}

/* Who sent a close method. */
enum tap_peer {
	TAP_BY_CLIENT = 0,
	TAP_BY_BROKER = 1,
};

#endif

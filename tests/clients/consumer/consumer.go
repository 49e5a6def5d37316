// A consumer through the tap (tests/integration/test_consumer.py) with Go's amqp091-go: prefetch 10, manual acks,
// N messages settled by the pattern every client of the test shares (settle_pattern in the test): one JSON line per
// delivery on stdout saying how the client settled it.
// Usage: consumer_go URL QUEUE N
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"

	amqp "github.com/rabbitmq/amqp091-go"
)

type settled struct {
	MessageID string `json:"message_id"`
	Tag       uint64 `json:"tag"`
	Outcome   string `json:"outcome"`
	Multiple  bool   `json:"multiple"`
}

func die(err error) {
	fmt.Fprintln(os.Stderr, "consumer_go:", err)
	os.Exit(1)
}

func main() {
	if len(os.Args) != 4 {
		die(fmt.Errorf("usage: consumer_go URL QUEUE N"))
	}
	n, err := strconv.Atoi(os.Args[3])
	if err != nil {
		die(err)
	}
	conn, err := amqp.Dial(os.Args[1])
	if err != nil {
		die(err)
	}
	ch, err := conn.Channel()
	if err != nil {
		die(err)
	}
	if err := ch.Qos(10, 0, false); err != nil {
		die(err)
	}
	msgs, err := ch.Consume(os.Args[2], "", false, false, false, false, nil)
	if err != nil {
		die(err)
	}
	var pending []settled
	out := func(s settled) {
		line, _ := json.Marshal(s)
		fmt.Println(string(line))
	}
	for i := 0; i < n; i++ {
		d, ok := <-msgs
		if !ok {
			die(fmt.Errorf("deliveries ended after %d", i))
		}
		s := settled{MessageID: d.MessageId, Tag: d.DeliveryTag}
		switch {
		case i%10 == 3:
			s.Outcome = "reject"
			err = d.Reject(false)
		case i%10 == 6:
			s.Outcome = "nack"
			err = d.Nack(false, false)
		case i%5 == 4 || i == n-1:
			s.Outcome, s.Multiple = "ack", i%5 == 4 || len(pending) > 0
			err = d.Ack(s.Multiple)
			for _, p := range pending {
				p.Outcome, p.Multiple = "ack", true
				out(p)
			}
			pending = pending[:0]
		default:
			pending = append(pending, s)
			continue
		}
		if err != nil {
			die(err)
		}
		out(s)
	}
	if err := ch.Close(); err != nil {
		die(err)
	}
	if err := conn.Close(); err != nil {
		die(err)
	}
}

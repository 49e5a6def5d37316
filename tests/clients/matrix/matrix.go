// The client-matrix cases (tests/integration/test_client_matrix.py) with Go's amqp091-go: every publish on a
// confirm channel, one JSON line per publish on stdout saying what the library itself reported.
// Usage: matrix_go URL EXCHANGE MISSING_EXCHANGE PREFIX
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

type outcome struct {
	MessageID string `json:"message_id"`
	Outcome   string `json:"outcome"`
}

func report(id, what string) {
	line, _ := json.Marshal(outcome{id, what})
	fmt.Println(string(line))
}

func die(err error) {
	fmt.Fprintln(os.Stderr, "matrix_go:", err)
	os.Exit(1)
}

// A confirm channel with its listeners, registered once before its first publish.
type channel struct {
	ch       *amqp.Channel
	confirms chan amqp.Confirmation
	returns  chan amqp.Return
	closed   chan *amqp.Error
}

// publish sends one message and waits for the library's answer: "returned+ack", "ack", "nack" or
// "closed:CODE" when the broker closed the channel instead.
func publish(c *channel, exchange, key, id string, mandatory bool) {
	err := c.ch.Publish(exchange, key, mandatory, false, amqp.Publishing{MessageId: id, Body: []byte("matrix " + id)})
	if err != nil {
		die(err)
	}
	returned := false
	for {
		select {
		case <-c.returns:
			returned = true
			continue
		case e := <-c.closed:
			report(id, fmt.Sprintf("closed:%d", e.Code))
			return
		case conf, ok := <-c.confirms:
			if !ok {
				continue /* the channel closed: its close reason follows on c.closed */
			}
			select { /* the library hands the Return over before the Ack that follows it */
			case <-c.returns:
				returned = true
			default:
			}
			what := "nack"
			if conf.Ack {
				what = "ack"
			}
			if returned {
				what = "returned+" + what
			}
			report(id, what)
			return
		case <-time.After(10 * time.Second):
			die(fmt.Errorf("%s: no answer in 10 s", id))
		}
	}
}

func main() {
	if len(os.Args) != 5 {
		die(fmt.Errorf("usage: matrix_go URL EXCHANGE MISSING_EXCHANGE PREFIX"))
	}
	url, exchange, missing, prefix := os.Args[1], os.Args[2], os.Args[3], os.Args[4]
	conn, err := amqp.Dial(url)
	if err != nil {
		die(err)
	}
	defer conn.Close()
	open := func() *channel {
		ch, err := conn.Channel()
		if err != nil {
			die(err)
		}
		if err := ch.Confirm(false); err != nil {
			die(err)
		}
		return &channel{ch, ch.NotifyPublish(make(chan amqp.Confirmation, 8)),
			ch.NotifyReturn(make(chan amqp.Return, 8)), ch.NotifyClose(make(chan *amqp.Error, 1))}
	}
	ch := open()
	publish(ch, exchange, "ok", prefix+"routable", true)
	publish(ch, exchange, "nomatch", prefix+"unroutable-mandatory", true)
	publish(ch, exchange, "nomatch", prefix+"unroutable-plain", false)
	publish(ch, exchange, "full", prefix+"fills-queue", true)
	publish(ch, exchange, "full", prefix+"overflow", true)
	publish(open(), missing, "ok", prefix+"missing-exchange", true)
	ch.ch.Close()
}

// An at-least-once publisher with amqp091-go for tests/integration/test_resend.py: confirms on, the unconfirmed set
// kept by delivery tag, resent after reconnecting (or not). Driven line by line on stdin, it answers on stdout:
//
//	(start)        connects to URL1 with connection_name NAME, publishes PREFIX-0..9 and waits for their acks: "ready"
//	"go"           publishes PREFIX-10..10+N-1 without waiting: "published"; then, when the broker ends the
//	               connection: "closed K" (K unconfirmed)
//	"reconnect"    connects to URL2 (retrying up to 60 s), resends the unconfirmed set when MODE is resend: "done"
//
// Usage: resend_go URL1 URL2 QUEUE NAME N MODE(resend|none)
package main

import (
	"bufio"
	"fmt"
	"os"
	"sort"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

type msg struct {
	id   string
	body []byte
}

type pub struct {
	conn     *amqp.Connection
	ch       *amqp.Channel
	confirms chan amqp.Confirmation
	closed   chan *amqp.Error
	pending  map[uint64]msg
	next     uint64
	queue    string
}

func die(err error) {
	fmt.Fprintln(os.Stderr, "resend_go:", err)
	os.Exit(1)
}

func connect(url, name, queue string) *pub {
	var conn *amqp.Connection
	var err error
	for end := time.Now().Add(60 * time.Second); time.Now().Before(end); time.Sleep(500 * time.Millisecond) {
		conn, err = amqp.DialConfig(url, amqp.Config{Properties: amqp.Table{"connection_name": name}})
		if err == nil {
			break
		}
	}
	if err != nil {
		die(err)
	}
	ch, err := conn.Channel()
	if err != nil {
		die(err)
	}
	if err := ch.Confirm(false); err != nil {
		die(err)
	}
	p := &pub{conn: conn, ch: ch, pending: map[uint64]msg{}, next: 1, queue: queue}
	p.confirms = ch.NotifyPublish(make(chan amqp.Confirmation, 10000))
	p.closed = conn.NotifyClose(make(chan *amqp.Error, 1))
	return p
}

func (p *pub) publish(m msg) {
	p.pending[p.next] = m
	p.next++
	err := p.ch.Publish("", p.queue, false, false,
		amqp.Publishing{MessageId: m.id, DeliveryMode: amqp.Persistent, Body: m.body})
	if err != nil {
		die(err)
	}
}

// Takes the confirmations until nothing is pending (true) or the connection ends (false).
func (p *pub) wait(all bool) bool {
	for len(p.pending) > 0 || !all {
		select {
		case c, ok := <-p.confirms:
			if !ok {
				return false
			}
			if c.Ack {
				delete(p.pending, c.DeliveryTag)
			}
		case <-p.closed:
			return false
		case <-time.After(60 * time.Second):
			die(fmt.Errorf("no confirm in 60 s"))
		}
	}
	return true
}

func main() {
	if len(os.Args) != 7 {
		die(fmt.Errorf("usage: resend_go URL1 URL2 QUEUE NAME N MODE"))
	}
	url1, url2, queue, name, mode := os.Args[1], os.Args[2], os.Args[3], os.Args[4], os.Args[6]
	n, err := strconv.Atoi(os.Args[5])
	if err != nil {
		die(err)
	}
	in := bufio.NewScanner(os.Stdin)
	p := connect(url1, name, queue)
	for i := 0; i < 10; i++ {
		p.publish(msg{fmt.Sprintf("%s-%d", name, i), []byte(fmt.Sprintf("body %s %d", name, i))})
	}
	if !p.wait(true) {
		die(fmt.Errorf("closed before the first acks"))
	}
	fmt.Println("ready")
	if !in.Scan() || in.Text() != "go" {
		die(fmt.Errorf("expected go"))
	}
	for i := 10; i < 10+n; i++ {
		p.publish(msg{fmt.Sprintf("%s-%d", name, i), []byte(fmt.Sprintf("body %s %d", name, i))})
	}
	fmt.Println("published")
	p.wait(false)
	lost := p.pending
	fmt.Printf("closed %d\n", len(lost))
	if !in.Scan() || in.Text() != "reconnect" {
		die(fmt.Errorf("expected reconnect"))
	}
	q := connect(url2, name, queue)
	if mode == "resend" {
		tags := make([]uint64, 0, len(lost))
		for t := range lost {
			tags = append(tags, t)
		}
		sort.Slice(tags, func(i, j int) bool { return tags[i] < tags[j] })
		for _, t := range tags {
			q.publish(lost[t])
		}
		if !q.wait(true) {
			die(fmt.Errorf("closed before the resends were acked"))
		}
	}
	q.conn.Close()
	fmt.Println("done")
}

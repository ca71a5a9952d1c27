package metrics

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/sirupsen/logrus"
)

// Handler serves GET /metrics (Prometheus's text format) and /healthz
// ("ok" while the daemon serves), and nothing else. A collector that fails
// leaves its metrics out; the others are still served.
func (m *Metrics) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{
		ErrorLog:            warnLog{m.opts.Log},
		ErrorHandling:       promhttp.ContinueOnError,
		MaxRequestsInFlight: 4,
		Timeout:             m.opts.StatsTimeout + 5*time.Second,
	}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	return mux
}

// Listen opens the endpoint's TCP port. Which addresses are acceptable is
// the daemon's configuration's decision.
func Listen(address string) (net.Listener, error) {
	l, err := net.Listen("tcp", address)
	if err != nil {
		return nil, fmt.Errorf("metrics: listen on %s: %w", address, err)
	}
	return l, nil
}

// Serve serves the endpoint on l until ctx ends. Slow clients are cut off:
// a request must arrive within 10 s and its answer leave within the
// scrape's bound.
func (m *Metrics) Serve(ctx context.Context, l net.Listener) error {
	srv := &http.Server{
		Handler:           m.Handler(),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      m.opts.StatsTimeout + 10*time.Second,
		IdleTimeout:       time.Minute,
		MaxHeaderBytes:    16 << 10,
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(l) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdown); err != nil {
		srv.Close()
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// warnLog gives promhttp's error log to logrus at warning level.
type warnLog struct{ log logrus.FieldLogger }

func (w warnLog) Println(v ...interface{}) { w.log.Warn(append([]interface{}{"metrics: "}, v...)...) }

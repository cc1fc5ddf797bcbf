// Package tlsconf is the control plane's server TLS: its certificate and key, and
// optionally the CA that verifies client certificates, read from PEM files and read
// again whenever a file changes, so that a certificate rotated on disk (cert-manager
// renewing a Kubernetes Secret, SPIRE writing a new SVID) is served from the next
// handshake without a restart.
//
// # Failure policy
//
// New fails when a file cannot be read or does not hold a valid certificate, key or
// CA: the control plane does not start. A file that changes into something invalid
// later (half written, wrong key for the certificate) is logged at most once per
// change and the last good material is kept: TLS keeps working with what worked.
package tlsconf

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// Files names the PEM files of the server's TLS.
type Files struct {
	// CertFile is the server certificate chain (leaf first), KeyFile its private
	// key. Both required.
	CertFile, KeyFile string
	// ClientCAFile holds the CA certificates that client certificates are verified
	// against. Empty: clients are not asked for a certificate.
	ClientCAFile string
}

// Server serves the files' current TLS material; safe for concurrent use.
type Server struct {
	f    Files
	log  *slog.Logger
	stat func(string) (os.FileInfo, error) // os.Stat

	mu     sync.Mutex
	stamps [3]stamp // cert, key, CA as last loaded
	bad    [3]stamp // the stamps last found invalid (logged once)
	cfg    *tls.Config
	loads  int

	handshakes atomic.Int64
}

// stamp identifies a version of a file: a changed size or modification time (Kubernetes
// swaps a Secret's files by a symlink, which os.Stat follows) is a change.
type stamp struct {
	size int64
	mod  time.Time
}

// New loads the files once and returns the Server; the error names the file.
func New(f Files, log *slog.Logger) (*Server, error) {
	if f.CertFile == "" || f.KeyFile == "" {
		return nil, errors.New("tlsconf: a certificate file and a key file are both required")
	}
	if log == nil {
		log = slog.Default()
	}
	s := &Server{f: f, log: log, stat: os.Stat}
	st, err := s.stampsNow()
	if err != nil {
		return nil, err
	}
	cfg, err := s.load()
	if err != nil {
		return nil, err
	}
	s.stamps, s.cfg, s.loads = st, cfg, 1
	return s, nil
}

// Config returns the tls.Config to serve with: TLS 1.2 or later, and with a client CA
// file, a client certificate verified against it when the client sends one
// (tls.VerifyClientCertIfGiven: the token-authenticated endpoints need none, the quota
// endpoint refuses a request without one). Every handshake first re-reads any file
// that changed.
func (s *Server) Config() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return s.current(), nil
		},
	}
}

// Handshakes returns how many TLS handshakes clients started (full or resumed).
func (s *Server) Handshakes() int64 { return s.handshakes.Load() }

// Loads returns how many times the files were loaded successfully (1 after New).
func (s *Server) Loads() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.loads
}

func (s *Server) paths() [3]string { return [3]string{s.f.CertFile, s.f.KeyFile, s.f.ClientCAFile} }

func (s *Server) stampsNow() ([3]stamp, error) {
	var st [3]stamp
	for i, p := range s.paths() {
		if p == "" {
			continue
		}
		fi, err := s.stat(p)
		if err != nil {
			return st, fmt.Errorf("tlsconf: %w", err)
		}
		st[i] = stamp{fi.Size(), fi.ModTime()}
	}
	return st, nil
}

// current returns the configuration for a handshake, reloading it first if a file
// changed since it was loaded.
func (s *Server) current() *tls.Config {
	s.handshakes.Add(1)
	s.mu.Lock()
	defer s.mu.Unlock()
	st, err := s.stampsNow()
	if err != nil || st == s.stamps {
		return s.cfg // a file briefly missing during a swap: keep serving
	}
	if st == s.bad {
		return s.cfg
	}
	cfg, err := s.load()
	if err != nil {
		s.bad = st
		s.log.Error("tls: the changed certificate files are not valid; still serving the previous ones", "err", err)
		return s.cfg
	}
	s.stamps, s.cfg = st, cfg
	s.loads++
	s.log.Info("tls: certificate files reloaded", "cert_file", s.f.CertFile, "not_after", cfg.Certificates[0].Leaf.NotAfter.UTC().Format(time.RFC3339))
	return cfg
}

func (s *Server) load() (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(s.f.CertFile, s.f.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("tlsconf: --tls-cert-file %s / --tls-key-file %s: %w", s.f.CertFile, s.f.KeyFile, err)
	}
	// The config a handshake uses is this one, so it carries the ALPN protocols
	// net/http serves (HTTP/2 and HTTP/1.1).
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2", "http/1.1"}}
	if s.f.ClientCAFile != "" {
		pem, err := os.ReadFile(s.f.ClientCAFile)
		if err != nil {
			return nil, fmt.Errorf("tlsconf: --client-ca-file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("tlsconf: --client-ca-file %s: no PEM certificate in it", s.f.ClientCAFile)
		}
		cfg.ClientCAs, cfg.ClientAuth = pool, tls.VerifyClientCertIfGiven
	}
	return cfg, nil
}

// Package wh talks to one Wormhole server through its own command line (`wh devices`,
// `wh tenant add|remove|list`), so the driver speaks exactly the admin protocol the server
// ships with and needs no second implementation of it.
package wh

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Server is one `wh serve`, reached on its local socket (root or the server's user only may
// add and remove tenants: the driver runs as one of them, beside the server).
type Server struct {
	// Wh is the `wh` executable.
	Wh string
	// Socket is the server's Unix socket.
	Socket string
}

// Device is one device of `wh devices`.
type Device struct {
	Name        string `json:"name"`
	Vendor      string `json:"vendor"`
	Kind        string `json:"kind"`
	MemoryBytes uint64 `json:"memory_bytes"`
	Version     string `json:"version"`
	Platform    string `json:"platform"`
}

// Inventory is the answer of `wh devices`.
type Inventory struct {
	APIs []struct {
		API     string   `json:"api"`
		Devices []Device `json:"devices"`
		Error   string   `json:"error,omitempty"`
	} `json:"apis"`
	Socket string  `json:"socket"`
	TCP    *string `json:"tcp"`
	TLS    bool    `json:"tls"`
}

// Tenant is one entry of `wh tenant list`.
type Tenant struct {
	Name           string  `json:"name"`
	AddedAtRunTime bool    `json:"added_at_run_time"`
	MemQuotaMiB    *uint64 `json:"mem_quota_mib"`
	MaxSessions    *uint64 `json:"max_sessions"`
	Sessions       int     `json:"sessions"`
}

// TenantSpec is what a claim's tenant may use.
type TenantSpec struct {
	Name        string
	MemQuotaMiB uint64
	MaxSessions uint64
	Devices     []string
}

// A remove waits for the tenant's sessions to end (their workers are killed after 2 s); an
// inventory may start a driver per API (each given 30 s by the server).
const (
	callTimeout      = 30 * time.Second
	inventoryTimeout = 3 * time.Minute
)

func (s Server) run(ctx context.Context, args ...string) ([]byte, error) {
	return s.runFor(ctx, callTimeout, args...)
}

func (s Server) runFor(ctx context.Context, limit time.Duration, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, s.Wh, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("wh %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), nil
}

// Devices lists the server's devices.
func (s Server) Devices(ctx context.Context) (*Inventory, error) {
	out, err := s.runFor(ctx, inventoryTimeout, "devices", "--socket", s.Socket)
	if err != nil {
		return nil, err
	}
	var inv Inventory
	if err := json.Unmarshal(out, &inv); err != nil {
		return nil, fmt.Errorf("wh devices: malformed answer: %w", err)
	}
	return &inv, nil
}

// Tenants lists the server's tenants.
func (s Server) Tenants(ctx context.Context) ([]Tenant, error) {
	out, err := s.run(ctx, "tenant", "list", "--socket", s.Socket)
	if err != nil {
		return nil, err
	}
	var list struct {
		Tenants []Tenant `json:"tenants"`
	}
	if err := json.Unmarshal(out, &list); err != nil {
		return nil, fmt.Errorf("wh tenant list: malformed answer: %w", err)
	}
	return list.Tenants, nil
}

// Add makes the tenant and returns its token. The token goes through a private file, never
// through the command line or a log.
func (s Server) Add(ctx context.Context, spec TenantSpec) (string, error) {
	dir, err := os.MkdirTemp("", "wh-dra-token-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	file := filepath.Join(dir, "token")
	args := []string{"tenant", "add", spec.Name, "--socket", s.Socket, "--token-file", file,
		"--mem-quota-mib", strconv.FormatUint(spec.MemQuotaMiB, 10)}
	if spec.MaxSessions > 0 {
		args = append(args, "--max-sessions", strconv.FormatUint(spec.MaxSessions, 10))
	}
	for _, d := range spec.Devices {
		args = append(args, "--device", d)
	}
	if _, err := s.run(ctx, args...); err != nil {
		return "", err
	}
	token, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("the token of %s: %w", spec.Name, err)
	}
	return strings.TrimSpace(string(token)), nil
}

// Remove revokes the tenant's token and ends its sessions; a tenant that is not there is
// not an error (removal is retried until it sticks).
func (s Server) Remove(ctx context.Context, name string) error {
	_, err := s.run(ctx, "tenant", "remove", name, "--socket", s.Socket)
	if err != nil && strings.Contains(err.Error(), "no tenant named ") {
		return nil
	}
	return err
}

// Package grant is what the controller hands the kubelet plugin for one claim's share of one
// server: a Secret in the driver's own namespace (never the claim's, whose users could edit
// it and so choose what the plugin mounts), holding the minted token, where to connect, and
// the share the token was minted for.
package grant

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"

	"k8s.io/apimachinery/pkg/types"
)

// Keys of the Secret's data.
const (
	KeyToken    = "token"
	KeyEndpoint = "endpoint"
	KeyAPI      = "api"
	KeyPool     = "pool"
	KeyTenant   = "tenant"
	// KeyShare is the share the token was minted for (Share.String), so a claim whose
	// allocation changed gets a new tenant.
	KeyShare = "share"
	// KeyCA is the CA certificate (PEM) a tls:// endpoint's certificate is checked against.
	KeyCA = "ca.crt"
)

// Labels that find a pool's grants and a claim's.
const (
	LabelClaimUID = "wormhole.dev/claim-uid"
	LabelPool     = "wormhole.dev/pool"
)

// Annotation naming the claim, for people reading the Secret.
const AnnotationClaim = "wormhole.dev/claim"

// SecretName names the grant of `claim` on `pool` (unique: a claim may hold shares of several
// servers).
func SecretName(claim types.UID, pool string) string {
	return fmt.Sprintf("wormhole-%s-%s", claim, pool)
}

// TenantPrefix starts the names of the tenants one pool makes: a server may be in two pools
// (local and network), and each pool's controller must find its own tenants only.
func TenantPrefix(pool string) string {
	sum := sha256.Sum256([]byte(pool))
	return "k8s-" + hex.EncodeToString(sum[:4]) + "-"
}

// TenantName is the server's tenant for a claim's share of `pool`: the claim's UID is never
// reused, so a tenant left over from a deleted claim can never be mistaken for a new one.
func TenantName(pool string, claim types.UID) string {
	return TenantPrefix(pool) + string(claim)
}

// Share is what a claim was allocated in one pool: the tenant's limits and devices.
type Share struct {
	MemoryMiB uint64
	Sessions  uint64
	Devices   []string
}

func (s Share) String() string {
	return fmt.Sprintf("memory=%dMi sessions=%d devices=%v", s.MemoryMiB, s.Sessions, s.Devices)
}

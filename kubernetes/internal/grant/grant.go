// Package grant is what the controller hands the kubelet plugin for one claim's share of one
// server: a Secret in the claim's namespace, owned by the claim (deleted with it), holding the
// minted token and where to connect.
package grant

import (
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
	KeyQuotaMiB = "memQuotaMiB"
	// KeyCA is the CA certificate (PEM) a tls:// endpoint's certificate is checked against.
	KeyCA = "ca.crt"
)

// Labels that find a claim's grants, and the pool that made them.
const (
	LabelClaimUID = "wormhole.dev/claim-uid"
	LabelPool     = "wormhole.dev/pool"
)

// SecretName names the grant of `claim` on `pool` (unique: a claim may hold shares of several
// servers).
func SecretName(claim types.UID, pool string) string {
	return fmt.Sprintf("wormhole-%s-%s", claim, pool)
}

// TenantName is the server's tenant for a claim: the claim's UID, never reused, so a tenant
// left over from a deleted claim can never be mistaken for a new one.
func TenantName(claim types.UID) string {
	return "k8s-" + string(claim)
}

// Package tenants keeps one server's tenants equal to the claims the scheduler allocated from
// its pool: a claim allocated a share of a device gets a tenant whose memory quota is the
// share's consumed capacity, with a token handed over in a Secret; a claim that loses its
// allocation (or is deleted) has its tenant removed, which revokes the token and ends its
// sessions. The loop is level-triggered: every pass compares all claims with all tenants,
// so a missed event or a restart of either side is repaired by the next pass.
package tenants

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"wormhole/kubernetes/internal/grant"
	"wormhole/kubernetes/internal/publish"
	"wormhole/kubernetes/internal/wh"
)

// Controller mints and revokes the tenants of one pool (one server).
type Controller struct {
	Driver string
	Pool   publish.Pool
	Server wh.Server
	Client kubernetes.Interface
	// CA is the certificate (PEM) a tls:// endpoint is checked against, handed over with
	// the token; empty otherwise.
	CA []byte
	// Devices are the published devices: name in the slice -> what the server calls it.
	Devices map[string]DeviceInfo
}

// DeviceInfo is what a tenant of a device needs to know about it.
type DeviceInfo struct {
	API         string
	Model       string
	MemoryBytes int64
	Sessions    int64
}

// share is one claim's part of this pool.
type share struct {
	claim    *resourceapi.ResourceClaim
	memory   int64
	sessions int64
	api      string
	models   []string
}

// Resync bounds how long a missed event goes unnoticed.
const Resync = 30 * time.Second

// Run reconciles until ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	claimsFactory := informers.NewSharedInformerFactory(c.Client, 10*time.Minute)
	secretsFactory := informers.NewSharedInformerFactoryWithOptions(c.Client, 10*time.Minute,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.LabelSelector = grant.LabelPool + "=" + c.Pool.Name
		}))
	claims := claimsFactory.Resource().V1().ResourceClaims()
	secrets := secretsFactory.Core().V1().Secrets()
	kick := make(chan struct{}, 1)
	notify := func(any) {
		select {
		case kick <- struct{}{}:
		default:
		}
	}
	handler := cache.ResourceEventHandlerFuncs{
		AddFunc:    notify,
		UpdateFunc: func(_, o any) { notify(o) },
		DeleteFunc: notify,
	}
	if _, err := claims.Informer().AddEventHandler(handler); err != nil {
		return err
	}
	if _, err := secrets.Informer().AddEventHandler(handler); err != nil {
		return err
	}
	claimsFactory.Start(ctx.Done())
	secretsFactory.Start(ctx.Done())
	for typ, ok := range claimsFactory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("cache of %v did not sync", typ)
		}
	}
	for typ, ok := range secretsFactory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("cache of %v did not sync", typ)
		}
	}
	timer := time.NewTimer(0)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-kick:
		case <-timer.C:
		}
		wait := Resync
		if err := c.reconcile(ctx, claims.Lister().List, secrets.Lister().List); err != nil {
			logger.Error(err, "Reconciling the pool's tenants failed; trying again", "pool", c.Pool.Name)
			wait = 2 * time.Second
		}
		timer.Reset(wait)
	}
}

func (c *Controller) reconcile(ctx context.Context,
	listClaims func(labels.Selector) ([]*resourceapi.ResourceClaim, error),
	listSecrets func(labels.Selector) ([]*corev1.Secret, error)) error {
	logger := klog.FromContext(ctx)
	all, err := listClaims(labels.Everything())
	if err != nil {
		return err
	}
	want := map[types.UID]*share{}
	for _, claim := range all {
		if s := c.shareOf(claim); s != nil {
			want[claim.UID] = s
		}
	}
	tenants, err := c.Server.Tenants(ctx)
	if err != nil {
		return err
	}
	have := map[string]wh.Tenant{}
	for _, t := range tenants {
		if t.AddedAtRunTime && strings.HasPrefix(t.Name, "k8s-") {
			have[t.Name] = t
		}
	}
	granted, err := listSecrets(labels.Everything())
	if err != nil {
		return err
	}
	secrets := map[string]*corev1.Secret{}
	for _, s := range granted {
		secrets[s.Namespace+"/"+s.Name] = s
	}
	var failed []error
	for uid, s := range want {
		name := grant.TenantName(uid)
		secretName := grant.SecretName(uid, c.Pool.Name)
		secret := secrets[s.claim.Namespace+"/"+secretName]
		if _, ok := have[name]; ok && secret != nil && string(secret.Data[grant.KeyTenant]) == name {
			continue
		}
		if _, ok := have[name]; ok {
			// Its token is lost (the Secret went): only a new one can be handed over.
			if err := c.Server.Remove(ctx, name); err != nil {
				failed = append(failed, err)
				continue
			}
		}
		if err := c.mint(ctx, s, name, secretName, secret); err != nil {
			failed = append(failed, fmt.Errorf("claim %s/%s: %w", s.claim.Namespace, s.claim.Name, err))
			continue
		}
		logger.Info("Tenant minted for claim", "claim", klog.KObj(s.claim), "tenant", name,
			"memQuotaMiB", s.memory>>20, "sessions", s.sessions, "pool", c.Pool.Name)
	}
	// Tenants whose removal failed keep their Secret, so the next pass still finds them.
	stuck := map[string]bool{}
	for name := range have {
		uid := types.UID(strings.TrimPrefix(name, "k8s-"))
		if _, ok := want[uid]; ok {
			continue
		}
		if err := c.Server.Remove(ctx, name); err != nil {
			failed = append(failed, err)
			stuck[name] = true
			continue
		}
		logger.Info("Tenant revoked: its claim is no longer allocated", "tenant", name, "pool", c.Pool.Name)
	}
	for _, secret := range secrets {
		if _, ok := want[types.UID(secret.Labels[grant.LabelClaimUID])]; ok {
			continue
		}
		if stuck[string(secret.Data[grant.KeyTenant])] {
			continue
		}
		err := c.Client.CoreV1().Secrets(secret.Namespace).Delete(ctx, secret.Name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			failed = append(failed, err)
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("%d of the pool's changes failed, the first: %w", len(failed), failed[0])
	}
	return nil
}

// shareOf is the claim's part of this pool, or nil when the scheduler gave it none.
func (c *Controller) shareOf(claim *resourceapi.ResourceClaim) *share {
	if claim.Status.Allocation == nil {
		return nil
	}
	var s *share
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != c.Driver || r.Pool != c.Pool.Name {
			continue
		}
		dev, ok := c.Devices[r.Device]
		if !ok {
			// A device this server no longer offers: the claim cannot be served here.
			continue
		}
		if s == nil {
			s = &share{claim: claim, api: dev.API}
		}
		// Without consumable capacity in the cluster, a result is the whole device.
		mem, sessions := dev.MemoryBytes, dev.Sessions
		if q, ok := r.ConsumedCapacity[publish.Memory]; ok {
			mem = q.Value()
		}
		if q, ok := r.ConsumedCapacity[publish.Sessions]; ok {
			sessions = q.Value()
		}
		s.memory += mem
		s.sessions += sessions
		s.models = append(s.models, dev.Model)
	}
	return s
}

// mint makes the claim's tenant and hands its token over in the claim's Secret.
func (c *Controller) mint(ctx context.Context, s *share, tenant, secretName string, old *corev1.Secret) error {
	token, err := c.Server.Add(ctx, wh.TenantSpec{
		Name:        tenant,
		MemQuotaMiB: uint64(s.memory >> 20),
		MaxSessions: uint64(s.sessions),
		Devices:     s.models,
	})
	if err != nil {
		return err
	}
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name:      secretName,
			Namespace: s.claim.Namespace,
			Labels: map[string]string{
				grant.LabelClaimUID: string(s.claim.UID),
				grant.LabelPool:     c.Pool.Name,
			},
			// Deleted with the claim, whatever becomes of this controller.
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "resource.k8s.io/v1",
				Kind:       "ResourceClaim",
				Name:       s.claim.Name,
				UID:        s.claim.UID,
				Controller: ptr.To(true),
			}},
		},
		Type: corev1.SecretTypeOpaque,
		Data: map[string][]byte{
			grant.KeyToken:    []byte(token),
			grant.KeyEndpoint: []byte(c.Pool.Endpoint),
			grant.KeyAPI:      []byte(s.api),
			grant.KeyPool:     []byte(c.Pool.Name),
			grant.KeyTenant:   []byte(tenant),
			grant.KeyQuotaMiB: []byte(fmt.Sprint(s.memory >> 20)),
		},
	}
	if len(c.CA) > 0 {
		secret.Data[grant.KeyCA] = c.CA
	}
	secrets := c.Client.CoreV1().Secrets(s.claim.Namespace)
	if old != nil {
		secret.ResourceVersion = old.ResourceVersion
		_, err = secrets.Update(ctx, secret, metav1.UpdateOptions{})
	} else {
		_, err = secrets.Create(ctx, secret, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			// Not in our cache yet: replace it.
			var cur *corev1.Secret
			if cur, err = secrets.Get(ctx, secretName, metav1.GetOptions{}); err == nil {
				secret.ResourceVersion = cur.ResourceVersion
				_, err = secrets.Update(ctx, secret, metav1.UpdateOptions{})
			}
		}
	}
	if err != nil {
		// A token nobody holds must not stay valid.
		if rmErr := c.Server.Remove(ctx, tenant); rmErr != nil {
			return fmt.Errorf("%w (and removing the tenant failed: %v)", err, rmErr)
		}
		return fmt.Errorf("cannot hand the token over: %w", err)
	}
	return nil
}

// Package tenants keeps one server's tenants equal to the claims the scheduler allocated from
// its pool: a claim allocated a share of a device gets a tenant whose memory quota is the
// share's consumed capacity, with a token handed over in a Secret in the driver's namespace;
// a claim that loses its allocation (or is deleted) has its tenant removed, which revokes the
// token and ends its sessions. The loop is level-triggered: every pass compares all claims
// with all of the pool's tenants, so a missed event or a restart of either side is repaired
// by the next pass.
package tenants

import (
	"context"
	"fmt"
	"sort"
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

	"wormhole/kubernetes/internal/grant"
	"wormhole/kubernetes/internal/publish"
	"wormhole/kubernetes/internal/wh"
)

// Server is what the controller needs of a Wormhole server (wh.Server; a fake in tests).
type Server interface {
	Tenants(ctx context.Context) ([]wh.Tenant, error)
	Add(ctx context.Context, spec wh.TenantSpec) (string, error)
	Remove(ctx context.Context, name string) error
}

// Controller mints and revokes the tenants of one pool (one server).
type Controller struct {
	Driver string
	Pool   publish.Pool
	Server Server
	Client kubernetes.Interface
	// Namespace holds the grants (the driver's own).
	Namespace string
	// CA is the certificate (PEM) a tls:// endpoint is checked against, handed over with
	// the token; empty otherwise.
	CA []byte
	// Devices are the published devices: name in the slice -> what the server calls it.
	Devices map[string]DeviceInfo

	// backoff delays claims whose tenant could not be made, so one failing claim does not
	// rewrite the server's state every pass.
	backoff map[types.UID]retry
}

type retry struct {
	at    time.Time
	delay time.Duration
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
	claim *resourceapi.ResourceClaim
	api   string
	grant.Share
}

// Resync bounds how long a missed event goes unnoticed.
const Resync = 30 * time.Second

// Run reconciles until ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	claimsFactory := informers.NewSharedInformerFactory(c.Client, 10*time.Minute)
	secretsFactory := informers.NewSharedInformerFactoryWithOptions(c.Client, 10*time.Minute,
		informers.WithNamespace(c.Namespace),
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
		// Events come in bursts (a pod's claim is created, allocated, reserved): one pass
		// for the burst.
		time.Sleep(100 * time.Millisecond)
		select {
		case <-kick:
		default:
		}
		wait := Resync
		if err := c.Reconcile(ctx, claims.Lister().List, secrets.Lister().List); err != nil {
			logger.Error(err, "Reconciling the pool's tenants failed; trying again", "pool", c.Pool.Name)
			wait = 2 * time.Second
		}
		timer.Reset(wait)
	}
}

// Reconcile makes one pass: tenants for the claims allocated from the pool, none for others.
func (c *Controller) Reconcile(ctx context.Context,
	listClaims func(labels.Selector) ([]*resourceapi.ResourceClaim, error),
	listSecrets func(labels.Selector) ([]*corev1.Secret, error)) error {
	logger := klog.FromContext(ctx)
	if c.backoff == nil {
		c.backoff = map[types.UID]retry{}
	}
	all, err := listClaims(labels.Everything())
	if err != nil {
		return err
	}
	want := map[types.UID]*share{}
	// Claims on devices this server does not (or no longer) lists: neither minted nor revoked.
	keep := map[types.UID]bool{}
	for _, claim := range all {
		s, unknown := c.shareOf(claim)
		if unknown != "" {
			logger.Info("Claim allocated a device the server does not list; its tenant is left as it is",
				"claim", klog.KObj(claim), "device", unknown, "pool", c.Pool.Name)
			keep[claim.UID] = true
			continue
		}
		if s != nil {
			want[claim.UID] = s
		}
	}
	tenants, err := c.Server.Tenants(ctx)
	if err != nil {
		return err
	}
	prefix := grant.TenantPrefix(c.Pool.Name)
	have := map[string]wh.Tenant{}
	for _, t := range tenants {
		if t.AddedAtRunTime && strings.HasPrefix(t.Name, prefix) {
			have[t.Name] = t
		}
	}
	granted, err := listSecrets(labels.Everything())
	if err != nil {
		return err
	}
	secrets := map[string]*corev1.Secret{}
	for _, s := range granted {
		secrets[s.Name] = s
	}
	var failed []error
	now := time.Now()
	for uid, s := range want {
		if r, ok := c.backoff[uid]; ok && now.Before(r.at) {
			continue
		}
		name := grant.TenantName(c.Pool.Name, uid)
		secretName := grant.SecretName(uid, c.Pool.Name)
		secret := secrets[secretName]
		tenant, minted := have[name]
		if minted && secret == nil {
			// The cache may lag behind a Secret made moments ago: ask before revoking.
			live, err := c.Client.CoreV1().Secrets(c.Namespace).Get(ctx, secretName, metav1.GetOptions{})
			if err == nil {
				secret = live
			} else if !apierrors.IsNotFound(err) {
				failed = append(failed, err)
				continue
			}
		}
		if minted && secret != nil && c.current(secret, tenant, name, s) {
			delete(c.backoff, uid)
			continue
		}
		if minted {
			// Its token is lost, or was minted for another share: only a new one will do.
			if err := c.Server.Remove(ctx, name); err != nil {
				failed = append(failed, err)
				continue
			}
		}
		if err := c.mint(ctx, s, name, secretName, secret); err != nil {
			failed = append(failed, fmt.Errorf("claim %s/%s: %w", s.claim.Namespace, s.claim.Name, err))
			r := c.backoff[uid]
			r.delay = min(max(2*r.delay, 2*time.Second), 5*time.Minute)
			r.at = now.Add(r.delay)
			c.backoff[uid] = r
			continue
		}
		delete(c.backoff, uid)
		logger.Info("Tenant minted for claim", "claim", klog.KObj(s.claim), "tenant", name,
			"share", s.Share.String(), "pool", c.Pool.Name)
	}
	for uid := range c.backoff {
		if _, ok := want[uid]; !ok {
			delete(c.backoff, uid)
		}
	}
	// Tenants whose removal failed keep their Secret, so the next pass still finds them.
	stuck := map[string]bool{}
	for name := range have {
		uid := types.UID(strings.TrimPrefix(name, prefix))
		if _, ok := want[uid]; ok || keep[uid] {
			continue
		}
		if err := c.Server.Remove(ctx, name); err != nil {
			failed = append(failed, err)
			stuck[name] = true
			continue
		}
		logger.Info("Tenant revoked: its claim is no longer allocated here", "tenant", name, "pool", c.Pool.Name)
	}
	for _, secret := range secrets {
		uid := types.UID(secret.Labels[grant.LabelClaimUID])
		if _, ok := want[uid]; ok || keep[uid] || stuck[string(secret.Data[grant.KeyTenant])] {
			continue
		}
		err := c.Client.CoreV1().Secrets(c.Namespace).Delete(ctx, secret.Name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			failed = append(failed, err)
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("%d of the pool's changes failed, the first: %w", len(failed), failed[0])
	}
	return nil
}

// current says whether the tenant and its Secret are what the share asks for.
func (c *Controller) current(secret *corev1.Secret, tenant wh.Tenant, name string, s *share) bool {
	return string(secret.Data[grant.KeyTenant]) == name &&
		string(secret.Data[grant.KeyShare]) == s.Share.String() &&
		tenant.MemQuotaMiB != nil && *tenant.MemQuotaMiB == s.MemoryMiB &&
		tenant.MaxSessions != nil && *tenant.MaxSessions == s.Sessions
}

// shareOf is the claim's part of this pool (nil when the scheduler gave it none), or the
// name of a device of this pool that the server does not list.
func (c *Controller) shareOf(claim *resourceapi.ResourceClaim) (*share, string) {
	if claim.Status.Allocation == nil {
		return nil, ""
	}
	var s *share
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != c.Driver || r.Pool != c.Pool.Name {
			continue
		}
		dev, ok := c.Devices[r.Device]
		if !ok {
			return nil, r.Device
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
		s.MemoryMiB += uint64(mem >> 20)
		s.Sessions += uint64(sessions)
		s.Devices = append(s.Devices, dev.Model)
	}
	if s != nil {
		sort.Strings(s.Devices)
	}
	return s, ""
}

// mint makes the claim's tenant and hands its token over in the grant Secret.
func (c *Controller) mint(ctx context.Context, s *share, tenant, secretName string, old *corev1.Secret) error {
	token, err := c.Server.Add(ctx, wh.TenantSpec{
		Name:        tenant,
		MemQuotaMiB: s.MemoryMiB,
		MaxSessions: s.Sessions,
		Devices:     s.Devices,
	})
	if err != nil {
		return err
	}
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name:      secretName,
			Namespace: c.Namespace,
			Labels: map[string]string{
				grant.LabelClaimUID: string(s.claim.UID),
				grant.LabelPool:     c.Pool.Name,
			},
			Annotations: map[string]string{grant.AnnotationClaim: s.claim.Namespace + "/" + s.claim.Name},
		},
		Type: corev1.SecretTypeOpaque,
		Data: map[string][]byte{
			grant.KeyToken:    []byte(token),
			grant.KeyEndpoint: []byte(c.Pool.Endpoint),
			grant.KeyAPI:      []byte(s.api),
			grant.KeyPool:     []byte(c.Pool.Name),
			grant.KeyTenant:   []byte(tenant),
			grant.KeyShare:    []byte(s.Share.String()),
		},
	}
	if len(c.CA) > 0 {
		secret.Data[grant.KeyCA] = c.CA
	}
	secrets := c.Client.CoreV1().Secrets(c.Namespace)
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

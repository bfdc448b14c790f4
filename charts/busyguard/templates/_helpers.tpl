{{/*
busyguard installs in the namespace busyguard: its webhooks, its fence and busyguard itself
(which never guards its own namespace) name it.
*/}}
{{- define "busyguard.namespace" -}}
{{- if ne .Release.Namespace "busyguard" -}}
{{- fail (printf "busyguard installs in the namespace busyguard, not %q: kubectl create namespace busyguard, label it (the chart's README says how), then helm install busyguard CHART --namespace busyguard" .Release.Namespace) -}}
{{- end -}}
busyguard
{{- end }}

{{/* The webhooks' caBundle, where the certificates are self-managed: a PEM certificate, or the
API server could not verify busyguard and every delete of a busy pod would fail closed. */}}
{{- define "busyguard.caBundle" -}}
{{- if eq .Values.certificates.source "self-managed" }}
{{- $ca := required "certificates.selfManaged.caCrt: the CA's certificate (PEM), e.g. --set-file certificates.selfManaged.caCrt=certs/ca.crt" .Values.certificates.selfManaged.caCrt }}
{{- if not (hasPrefix "-----BEGIN CERTIFICATE-----" (trim $ca)) }}
{{- fail "certificates.selfManaged.caCrt is not a PEM certificate (-----BEGIN CERTIFICATE-----): pass the file with --set-file certificates.selfManaged.caCrt=certs/ca.crt" }}
{{- end }}
caBundle: {{ $ca | b64enc }}
{{- end }}
{{- end }}

{{/* Values given where they are not read: said, not ignored. */}}
{{- define "busyguard.checks" -}}
{{- $self := .Values.certificates.selfManaged }}
{{- if and (eq .Values.certificates.source "cert-manager") (or $self.tlsCrt $self.tlsKey $self.caCrt) }}
{{- fail "certificates.selfManaged.* is set, but certificates.source is cert-manager, which ignores it: set certificates.source=self-managed, or drop them" }}
{{- end }}
{{- end }}

{{/* Where cert-manager's CA injector writes the CA into both webhook configurations. */}}
{{- define "busyguard.webhookAnnotations" -}}
{{- if eq .Values.certificates.source "cert-manager" }}
annotations:
  cert-manager.io/inject-ca-from: {{ include "busyguard.namespace" . }}/busyguard
{{- end }}
{{- end }}

{{/* Every webhook's namespaceSelector terms: busyguard.io/enabled (opt-in: only "true"), and
watchNamespaces' names where it lists any (busyguard watches those only). */}}
{{- define "busyguard.enabledTerm" -}}
{{- if .Values.optIn }}
- {key: busyguard.io/enabled, operator: In, values: ["true"]}
{{- else }}
- {key: busyguard.io/enabled, operator: NotIn, values: ["false"]}
{{- end }}
{{- with .Values.watchNamespaces }}
- {key: kubernetes.io/metadata.name, operator: In, values: {{ toJson . }}}
{{- end }}
{{- end }}

{{/* busyguard's arguments: serve, then each component's rules and the user's. */}}
{{- define "busyguard.args" -}}
- serve
{{- if .Values.actionsRunnerController.enabled }}
- "--busy-with-pod=runner-pod"
- {{ printf "--busy-when-owner=actions.github.com/v1alpha1/EphemeralRunner;new-pods-idle;max-busy=%s=has(object.status) && ((has(object.status.jobId) && object.status.jobId != '') || (has(object.status.jobRequestId) && object.status.jobRequestId > 0))" .Values.actionsRunnerController.maxBusy | quote }}
{{- end }}
{{- if .Values.agones.enabled }}
- {{ printf "--busy-when-owner=agones.dev/v1/GameServer=%s" .Values.agones.rule | quote }}
{{- end }}
{{- if .Values.agentSandbox.enabled }}
- {{ printf "--busy-when-owner=agents.x-k8s.io/v1beta1/Sandbox;max-busy=%s=%s" .Values.agentSandbox.maxBusy .Values.agentSandbox.rule | quote }}
{{- end }}
{{- range .Values.busyWhenOwner }}
{{- if and $.Values.agentSandbox.enabled (regexMatch "^agents\\.x-k8s\\.io/v1beta1/Sandbox[=;]" .) }}
{{- fail "busyWhenOwner: agentSandbox.enabled names the Sandbox rule already: set agentSandbox.rule and agentSandbox.maxBusy instead (docs/agent-sandbox.md)" }}
{{- end }}
{{- if and $.Values.agones.enabled (regexMatch "^agones\\.dev/v1/GameServer[=;]" .) }}
{{- fail "busyWhenOwner: agones.enabled names the GameServer rule already: set agones.rule instead (docs/agones.md)" }}
{{- end }}
{{- if and $.Values.actionsRunnerController.enabled (regexMatch "^actions\\.github\\.com/v1alpha1/EphemeralRunner[=;]" .) }}
{{- fail "busyWhenOwner: actionsRunnerController.enabled names the EphemeralRunner rule already (its max-busy is actionsRunnerController.maxBusy)" }}
{{- end }}
- {{ printf "--busy-when-owner=%s" . | quote }}
{{- end }}
{{- if .Values.kueue.enabled }}
- "--hold-kueue-preemption=true"
{{- end }}
{{- range $key, $value := .Values.busyAnnotations }}
- {{ printf "--busy-annotation=%s=%s" $key (toString $value) | quote }}
{{- end }}
{{- range $key, $value := .Values.busyLabels }}
- {{ printf "--busy-label=%s=%s" $key (toString $value) | quote }}
{{- end }}
{{- if ne (include "busyguard.karpenterUsers" .) "'system:serviceaccount:kube-system:karpenter', 'system:serviceaccount:karpenter:karpenter'" }}
- {{ printf "--karpenter-user=%s" (join "," .Values.karpenter.users) | quote }}
{{- end }}
{{- range .Values.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end }}

{{/* `env` may not name a variable the chart sets from a value of its own: a server-side apply
refuses the duplicate, a client-side one keeps the later without a word. */}}
{{- define "busyguard.envSetByTheChart" -}}
{{- $own := dict "BUSYGUARD_TLS_CERT" "" "BUSYGUARD_TLS_KEY" "" "BUSYGUARD_LOG_FORMAT" "logFormat" "BUSYGUARD_SHUTDOWN_DELAY" "" "BUSYGUARD_SHUTDOWN_TIMEOUT" "shutdownTimeout" "BUSYGUARD_BUSY_PDB" "busyPdb" "POD_NAMESPACE" "" "BUSYGUARD_OPT_IN" "optIn" "BUSYGUARD_NAMESPACES" "watchNamespaces" "BUSYGUARD_MODE" "mode" }}
{{- range $name, $value := .Values.env }}
{{- if hasKey $own $name }}
{{- $instead := get $own $name }}
{{- fail (printf "env.%s: the chart sets %s itself%s" $name $name (ternary "" (printf ": set the value %s instead" $instead) (eq $instead ""))) }}
{{- end }}
{{- end }}
{{- end }}

{{/* Karpenter's service accounts (karpenter.users), as a CEL list: every webhook condition that
names Karpenter reads it, and so does --karpenter-user. */}}
{{- define "busyguard.karpenterUsers" -}}
{{- $quoted := list }}
{{- range .Values.karpenter.users }}{{ $quoted = append $quoted (printf "'%s'" .) }}{{ end }}
{{- join ", " $quoted }}
{{- end }}

{{/* The `helm test` hook's annotations, and the namespace it checks (test.namespace; empty: the
first of watchNamespaces, else default). */}}
{{- define "busyguard.testHook" -}}
helm.sh/hook: test
helm.sh/hook-weight: "-1"
helm.sh/hook-delete-policy: before-hook-creation,hook-succeeded
{{- end }}
{{- define "busyguard.testNamespace" -}}
{{- .Values.test.namespace | default (first .Values.watchNamespaces) | default "default" }}
{{- end }}

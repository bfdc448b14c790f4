{{/*
busyguard installs in the namespace busyguard: its webhooks, its fence and busyguard itself
(which never guards its own namespace) name it.
*/}}
{{- define "busyguard.namespace" -}}
{{- if ne .Release.Namespace "busyguard" -}}
{{- fail (printf "busyguard installs in the namespace busyguard, not %q: helm install busyguard CHART --namespace busyguard --create-namespace" .Release.Namespace) -}}
{{- end -}}
busyguard
{{- end }}

{{/* The webhooks' caBundle, where the certificates are self-managed. */}}
{{- define "busyguard.caBundle" -}}
{{- if eq .Values.certificates.source "self-managed" }}
caBundle: {{ required "certificates.selfManaged.caCrt: the CA's certificate (PEM), e.g. --set-file certificates.selfManaged.caCrt=certs/ca.crt" .Values.certificates.selfManaged.caCrt | b64enc }}
{{- end }}
{{- end }}

{{/* Where cert-manager's CA injector writes the CA into both webhook configurations. */}}
{{- define "busyguard.webhookAnnotations" -}}
{{- if eq .Values.certificates.source "cert-manager" }}
annotations:
  cert-manager.io/inject-ca-from: {{ include "busyguard.namespace" . }}/busyguard
{{- end }}
{{- end }}

{{/* Every webhook's namespaceSelector term on busyguard.io/enabled (opt-in: only "true"). */}}
{{- define "busyguard.enabledTerm" -}}
{{- if .Values.optIn }}
- {key: busyguard.io/enabled, operator: In, values: ["true"]}
{{- else }}
- {key: busyguard.io/enabled, operator: NotIn, values: ["false"]}
{{- end }}
{{- end }}

{{/* The namespaces every webhook selects. */}}
{{- define "busyguard.namespaceSelector" -}}
namespaceSelector:
  matchExpressions:
    - key: kubernetes.io/metadata.name
      operator: NotIn
      values: ["kube-system", "busyguard"]
    {{- include "busyguard.enabledTerm" . | nindent 4 }}
{{- end }}

{{/* Where a webhook sends its reviews: path. */}}
{{- define "busyguard.clientConfig" -}}
clientConfig:
  service:
    name: busyguard
    namespace: {{ include "busyguard.namespace" .root }}
    path: {{ .path }}
    port: 443
  {{- include "busyguard.caBundle" .root | nindent 2 }}
{{- end }}

{{/* Agones' own controller ending its game server's pod: not sent to the delete webhooks. */}}
{{- define "busyguard.agonesEndsItsGameServer" -}}
- name: not-agones-ending-its-game-server
  expression: "!(request.userInfo.username == 'system:serviceaccount:{{ .Values.agones.namespace }}:agones-controller' && has(oldObject.metadata.labels) && 'agones.dev/gameserver' in oldObject.metadata.labels)"
{{- end }}

{{/* The webhooks that opt the owners' pods in at creation. */}}
{{- define "busyguard.ownerPodWebhooks" -}}
{{- $common := dict "root" . "path" "/mutate" }}
{{- if .Values.actionsRunnerController.enabled }}
- name: actions-runner-controller.busyguard.io
  admissionReviewVersions: ["v1"]
  sideEffects: NoneOnDryRun
  matchPolicy: Equivalent
  timeoutSeconds: 3
  failurePolicy: Ignore
  reinvocationPolicy: IfNeeded
  rules:
    - {apiGroups: [""], apiVersions: ["v1"], operations: ["CREATE"], resources: ["pods"], scope: Namespaced}
  objectSelector:
    matchExpressions:
      - {key: busyguard.io/busy, operator: DoesNotExist}
      - {key: actions-ephemeral-runner, operator: Exists}
  matchConditions:
    - name: owned-by-an-ephemeral-runner
      expression: "has(object.metadata.ownerReferences) && object.metadata.ownerReferences.exists(o, has(o.controller) && o.controller && o.kind == 'EphemeralRunner' && o.apiVersion.startsWith('actions.github.com/'))"
  {{- include "busyguard.clientConfig" $common | nindent 2 }}
  {{- include "busyguard.namespaceSelector" . | nindent 2 }}
- name: actions-runner-controller-workflows.busyguard.io
  admissionReviewVersions: ["v1"]
  sideEffects: NoneOnDryRun
  matchPolicy: Equivalent
  timeoutSeconds: 3
  failurePolicy: Ignore
  reinvocationPolicy: IfNeeded
  rules:
    - {apiGroups: [""], apiVersions: ["v1"], operations: ["CREATE"], resources: ["pods"], scope: Namespaced}
  objectSelector:
    matchExpressions:
      - {key: busyguard.io/busy, operator: DoesNotExist}
      - {key: runner-pod, operator: Exists}
  {{- include "busyguard.clientConfig" $common | nindent 2 }}
  {{- include "busyguard.namespaceSelector" . | nindent 2 }}
{{- end }}
{{- if .Values.agones.enabled }}
- name: agones.busyguard.io
  admissionReviewVersions: ["v1"]
  sideEffects: NoneOnDryRun
  matchPolicy: Equivalent
  timeoutSeconds: 3
  failurePolicy: Ignore
  reinvocationPolicy: IfNeeded
  rules:
    - {apiGroups: [""], apiVersions: ["v1"], operations: ["CREATE"], resources: ["pods"], scope: Namespaced}
  objectSelector:
    matchExpressions:
      - {key: busyguard.io/busy, operator: DoesNotExist}
      - {key: agones.dev/gameserver, operator: Exists}
  matchConditions:
    - name: owned-by-a-game-server
      expression: "has(object.metadata.ownerReferences) && object.metadata.ownerReferences.exists(o, has(o.controller) && o.controller && o.kind == 'GameServer' && o.apiVersion.startsWith('agones.dev/'))"
  {{- include "busyguard.clientConfig" $common | nindent 2 }}
  {{- include "busyguard.namespaceSelector" . | nindent 2 }}
{{- end }}
{{- end }}

{{/* Agones' allocations of a game server whose pod is held: refused with a conflict. */}}
{{- define "busyguard.ownerValidatingWebhooks" -}}
{{- if .Values.agones.enabled }}
- name: agones-allocations.busyguard.io
  admissionReviewVersions: ["v1"]
  sideEffects: None
  matchPolicy: Equivalent
  timeoutSeconds: 3
  failurePolicy: Ignore
  rules:
    - {apiGroups: ["agones.dev"], apiVersions: ["v1"], operations: ["UPDATE"], resources: ["gameservers"], scope: Namespaced}
  matchConditions:
    - name: turns-allocated
      expression: "has(object.status) && has(object.status.state) && object.status.state == 'Allocated' && !(has(oldObject.status) && has(oldObject.status.state) && oldObject.status.state == 'Allocated')"
  {{- include "busyguard.clientConfig" (dict "root" . "path" "/validate") | nindent 2 }}
  {{- include "busyguard.namespaceSelector" . | nindent 2 }}
{{- end }}
{{- end }}

{{/* busyguard's arguments: serve, then each component's rules and the user's. */}}
{{- define "busyguard.args" -}}
- serve
{{- if .Values.actionsRunnerController.enabled }}
- "--busy-with-pod=runner-pod"
- "--busy-when-owner=actions.github.com/v1alpha1/EphemeralRunner=has(object.status) && ((has(object.status.jobId) && object.status.jobId != '') || (has(object.status.jobRequestId) && object.status.jobRequestId > 0))"
{{- end }}
{{- if .Values.agones.enabled }}
- "--busy-when-owner=agones.dev/v1/GameServer=!has(object.metadata.deletionTimestamp) && has(object.status) && has(object.status.state) && object.status.state in ['Allocated', 'Reserved']"
{{- end }}
{{- range .Values.busyWhenOwner }}
- {{ printf "--busy-when-owner=%s" . | quote }}
{{- end }}
{{- range .Values.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end }}

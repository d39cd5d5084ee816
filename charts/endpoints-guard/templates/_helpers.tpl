{{/* Chart name, truncated to 63 characters. */}}
{{- define "endpoints-guard.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Fully qualified app name; the release name alone when it already contains the chart name. */}}
{{- define "endpoints-guard.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "endpoints-guard.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "endpoints-guard.selectorLabels" -}}
app.kubernetes.io/name: {{ include "endpoints-guard.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "endpoints-guard.labels" -}}
helm.sh/chart: {{ include "endpoints-guard.chart" . }}
{{ include "endpoints-guard.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "endpoints-guard.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "endpoints-guard.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* repository@digest when a digest is set, else repository:tag (tag defaults to appVersion). */}}
{{- define "endpoints-guard.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* Namespace of the leader Lease. */}}
{{- define "endpoints-guard.leaseNamespace" -}}
{{- default .Release.Namespace .Values.leaderElection.namespace }}
{{- end }}

{{/* The metrics Service's name; Prometheus gives its scrapes job=<this>. */}}
{{- define "endpoints-guard.metricsService" -}}
{{- printf "%s-metrics" (include "endpoints-guard.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Refuse settings that would make two replicas write at once. */}}
{{- define "endpoints-guard.validate" -}}
{{- if and (gt (int .Values.replicaCount) 1) (not .Values.leaderElection.enabled) }}
{{- fail "replicaCount > 1 needs leaderElection.enabled=true: without it every replica writes Endpoints" }}
{{- end }}
{{- if eq .Values.scope "opt-in" }}
{{- if eq .Values.managedBy "upstream" }}
{{- fail "scope opt-in writes its own managed-by value (kube-controller-manager's controllers, still on, would take objects with theirs): leave managedBy empty or set it to own" }}
{{- end }}
{{- if not (and (has "endpoints" .Values.controllers) (has "endpointslices" .Values.controllers)) }}
{{- fail "scope opt-in runs both controllers (an opted-in Service's Endpoints that nobody rewrites stay frozen and are mirrored into slices): controllers must list endpoints and endpointslices" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Alert expression: counter .metric (matchers .sel) rose within .window, per .by
(aggregated with .agg). increase() sees the increments of a series Prometheus
already had; the second part sees a series that appears already above 0 (an
increment before its first scrape), as a series without any sample in the
window before this one. endpoints-guard exports its counters at 0 from start-up,
so the second part is the exception, not the rule.
*/}}
{{- define "endpoints-guard.counterRose" -}}
{{ .agg }} by ({{ .by }}) (increase({{ .metric }}{ {{- .sel -}} }[{{ .window }}])) > 0
or
{{ .agg }} by ({{ .by }}) ({{ .metric }}{ {{- .sel -}} } unless present_over_time({{ .metric }}{ {{- .sel -}} }[{{ .window }}] offset {{ .window }})) > 0
{{- end }}

{{/* The container port the metrics Service targets: https with metrics.secure, else metrics. */}}
{{- define "endpoints-guard.metricsTargetPort" -}}
{{- if .Values.metrics.secure }}https{{ else }}metrics{{ end }}
{{- end }}

{{/* Whole seconds of a Go duration (1h30m, 20m, 90s; ms, us and ns add fractions, dropped). */}}
{{- define "endpoints-guard.seconds" -}}
{{- $total := 0.0 }}
{{- range regexFindAll "[0-9]+(\\.[0-9]+)?(ns|us|µs|ms|s|m|h)" . -1 }}
{{- $unit := regexFind "(ns|us|µs|ms|s|m|h)$" . }}
{{- $n := float64 (trimSuffix $unit .) }}
{{- $scale := get (dict "h" 3600.0 "m" 60.0 "s" 1.0 "ms" 0.001 "us" 0.000001 "µs" 0.000001 "ns" 0.000000001) $unit }}
{{- $total = addf $total (mulf $n $scale) }}
{{- end }}
{{- floor $total | int64 }}
{{- end }}

{{/*
The API server's direct address (apiServer.host/port), as the environment
in-cluster clients read it; nothing when unset (the `kubernetes` Service).
*/}}
{{- define "endpoints-guard.apiServerEnv" -}}
{{- with .Values.apiServer.host }}
- name: KUBERNETES_SERVICE_HOST
  value: {{ . | quote }}
- name: KUBERNETES_SERVICE_PORT
  value: {{ $.Values.apiServer.port | quote }}
{{- end }}
{{- end }}

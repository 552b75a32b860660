{{- define "a2a-gateway.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "a2a-gateway.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "a2a-gateway.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The Secret holding the admin token (key admin-token). */}}
{{- define "a2a-gateway.adminSecret" -}}
{{- .Values.admin.existingSecret | default (printf "%s-admin" (include "a2a-gateway.fullname" .)) -}}
{{- end -}}

{{/* Whether the gateway uses Redis. */}}
{{- define "a2a-gateway.redis" -}}
{{- if or .Values.redis.url .Values.redis.existingSecret -}}true{{- end -}}
{{- end -}}

{{/* The gateway's config file. */}}
{{- define "a2a-gateway.config" -}}
[server]
listen = "0.0.0.0:{{ .Values.service.port }}"
admin = "0.0.0.0:{{ .Values.admin.port }}"
admin_token_env = "A2A_GATEWAY_ADMIN_TOKEN"
threads = {{ .Values.threads }}
log_format = {{ .Values.logFormat | quote }}

[timeouts]
drain = "{{ .Values.drainSeconds }}s"

{{ .Values.config }}
{{- end -}}
